-- One row per (customer, identifier type, identifier): the external ids of every served customer.
with identifiers as (
    select * from {{ ref('int_customer_identifiers') }}
),

customers as (
    select customer_id from {{ ref('customers') }}
),

final as (
    select identifiers.*
    from identifiers
    inner join customers on identifiers.customer_id = customers.customer_id
)

select * from final
