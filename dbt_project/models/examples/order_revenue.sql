-- One row per `Order Completed` track: who ordered, when, and the revenue it carries. A
-- per-message model: each pass computes the rows of the messages it rewrote and replaces theirs.
{{
    config(
        materialized='incremental',
        incremental_strategy='per_message',
        unique_key=['account_id', 'message_id'],
    )
}}

with messages as (
    select * from {{ pass_messages() }}
),

final as (
    select
        account_id,
        message_id,
        customer_id,
        event_time,
        try_cast(properties ->> '$.revenue' as decimal(18, 2)) as revenue
    from messages
    where event_action = 'order_completed'
)

select * from final
