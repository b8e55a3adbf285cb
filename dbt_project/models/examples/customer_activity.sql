-- One row per customer: how many events they sent, of how many actions, and when they were
-- first and last seen (by event time). A per-customer model: each pass recomputes the customers
-- it changed from all their messages and replaces their rows.
{{
    config(
        materialized='incremental',
        incremental_strategy='per_customer',
        unique_key='customer_id',
    )
}}

with messages as (
    select * from {{ pass_customer_messages() }}
),

final as (
    select
        customer_id,
        any_value(account_id) as account_id,
        count(*) as events,
        count(distinct event_action) as actions,
        min(event_time) as first_seen,
        max(event_time) as last_seen
    from messages
    group by customer_id
)

select * from final
