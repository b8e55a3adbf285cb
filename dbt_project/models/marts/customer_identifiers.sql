-- One row per (served customer, identifier type, identifier): every userId, anonymousId and email
-- a served customer has been seen with, with first and last seen times. The mapping of
-- identifiers to customers (issue 5). A view: the min and max over the identifier's sightings in
-- customer_identifier_sightings (one row each once compaction has merged them). A lookup by
-- customer_id or by identifier reaches the scan.
{{ config(materialized='view') }}

with sightings as (
    select * from {{ ref('customer_identifier_sightings') }}
),

final as (
    select
        customer_id,
        account_id,
        id_type,
        id_value,
        min(first_seen) as first_seen,
        max(last_seen) as last_seen
    from sightings
    group by customer_id, account_id, id_type, id_value
)

select * from final
