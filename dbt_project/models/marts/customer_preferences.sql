-- One row per served customer with a subscription id (grain: subscription_id): what the
-- marketing-preferences endpoints read (INTERFACE.md 2.6, 4.5). The subscription id is the
-- only key; it is never listed by any API.
{{
    config(
        materialized='incremental',
        incremental_strategy='replace_customers',
        unique_key='customer_id',
    )
}}

with customers as (
    select * from {{ ref('customer_profiles') }}
    {{ where_customer_changed() }}
),

preferences as (
    select * from {{ ref('int_customer_preferences') }}
    {{ where_customer_changed(rewritten=true) }}
),

final as (
    select
        customers.subscription_id,
        customers.customer_id,
        customers.client_id,
        customers.account_id,
        preferences.home_brand_id as brand_id,
        customers.user_id,
        preferences.anonymous_id,
        preferences.marketing_preferences,
        preferences.state
    from customers
    inner join preferences on customers.customer_id = preferences.customer_id
    where customers.subscription_id is not null
    order by customers.subscription_id
)

select * from final
