-- One row per (customer, identifier type, identifier): every userId, anonymousId and email
-- a customer has been seen with, with first and last seen times. The mapping of
-- identifiers to customers. A view: fold rule identifier_spans (macros/folds.sql) over the
-- sightings in customer_identifier_sightings (one row each once compaction has merged them). A
-- lookup by customer_id or by identifier reaches the scan.
{{ config(materialized='view') }}

with spans as (
    select * from {{ fold_rule('identifier_spans', ref('customer_identifier_sightings')) }}
),

final as (
    select
        customer_id,
        account_id,
        id_type,
        id_value,
        first_seen,
        last_seen
    from spans
)

select * from final
