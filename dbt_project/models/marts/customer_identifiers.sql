-- One row per (customer, identifier type, identifier): the external ids of every served customer.
{{
    config(
        materialized='incremental',
        incremental_strategy='replace_customers',
        unique_key='customer_id',
    )
}}

with identifiers as (
    select * from {{ ref('int_customer_identifiers') }}
    {{ where_customer_changed(rewritten=true) }}
),

customers as (
    select customer_id from {{ ref('customer_profiles') }}
    {{ where_customer_changed() }}
),

final as (
    select
        identifiers.customer_id,
        identifiers.account_id,
        identifiers.id_type,
        identifiers.id_value,
        identifiers.first_seen,
        identifiers.last_seen
    from identifiers
    inner join customers on identifiers.customer_id = customers.customer_id
)

select * from final
