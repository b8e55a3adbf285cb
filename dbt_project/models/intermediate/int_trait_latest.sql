-- One row per (customer, top-level trait key): the value with the latest event time (ties: later
-- receipt, then messageId), whatever order messages arrived in, with the keys it won by. This is
-- the state incremental passes fold new identifies into: a pass compares only the rewritten
-- messages' values against these winners, never the customer's whole history.
{{
    config(
        materialized='incremental',
        incremental_strategy='replace_customers',
        on_schema_change='append_new_columns',
        unique_key='customer_id',
    )
}}

{%- set columns = [
    "customer_id", "trait_key", "trait_value", "event_time", "received_at", "message_id"
] %}

with candidates as (
    {{ merge_input(ref('int_trait_history'), columns) }}
    {{ union_stored_state(columns) }}
),

final as (
    select
        customer_id,
        trait_key,
        arg_max(trait_value, (event_time, received_at, message_id)) as trait_value,
        max(event_time) as event_time,
        arg_max(received_at, (event_time, received_at, message_id)) as received_at,
        arg_max(message_id, (event_time, received_at, message_id)) as message_id,
        {{ written_by_pass() }}
    from candidates
    group by customer_id, trait_key
)

select * from final
