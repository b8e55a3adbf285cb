-- One row per customer with a subscription id (grain: subscription_id): what the
-- marketing-preferences endpoints read. The subscription id is the
-- only key; it is never listed by any API.
-- A view of customer_profiles, which carries these columns: a table of its own would be written
-- again for each changed customer though preferences rarely change.
{{ config(materialized='view') }}

with profiles as (
    select * from {{ ref('customer_profiles') }}
),

final as (
    select
        subscription_id,
        customer_id,
        client_id,
        account_id,
        home_brand_id as brand_id,
        user_id,
        anonymous_id,
        marketing_preferences,
        preference_state as state
    from profiles
    where subscription_id is not null
)

select * from final
