-- One row per journey_step_entered event (grain: event_id): a customer's journey instance
-- entering a step. The journey runtime records the event through the collector (library
-- mallard-dispatch, the customer's userId) at each transition; `entered_at` is the journey
-- clock's time of the transition, which may be ahead of `received_at` in tests.
-- A per-message model: each pass replaces the rows of the messages it rewrote.
{{
    config(
        materialized='incremental',
        incremental_strategy='per_message',
        unique_key=['account_id', 'message_id'],
    )
}}

with messages as (
    select * from {{ pass_messages() }}
    where type = 'track' and event_action = 'journey_step_entered'
),

final as (
    select
        event_id,
        message_id,
        account_id,
        brand_id,
        client_id,
        customer_id,
        customer_user_id as user_id,
        properties ->> '$.journeyId' as journey_id,
        properties ->> '$.instanceId' as instance_id,
        properties ->> '$.stepId' as step_id,
        properties ->> '$.stepType' as step_type,
        properties ->> '$.previousStepId' as previous_step_id,
        try_cast(properties ->> '$.visit' as integer) as visit,
        try_cast(properties ->> '$.dueAt' as timestamptz) as due_at,
        event_time as entered_at,
        received_at
    from messages
)

select * from final
