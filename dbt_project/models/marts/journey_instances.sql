-- One row per journey instance (grain: account_id, instance_id): where a customer is in a
-- journey, or how and when the instance ended, from the instance's journey_started,
-- journey_step_entered and journey_exited events. An instance's events all carry its customer's
-- userId, so they belong to one customer.
-- A per-customer model: each pass recomputes every instance of the customers it changes from all
-- their journey events and replaces their rows, so an instance whose exit arrives passes after
-- its start shows the exit. The filter on the event's action reaches the scan of the messages
-- before the join to the changed customers: a pass reads the few journey events of those
-- customers, not their whole history.
-- The current step is the latest entered by the journey clock, then by visit, then by eventId
-- (the runtime stamps a transition's events in order, and eventIds grow with stamping): one
-- transition may enter several steps at the same clock time (a send, then its wait).
{{
    config(
        materialized='incremental',
        incremental_strategy='per_customer',
        unique_key='customer_id',
    )
}}

with messages as (
    select * from {{ pass_customer_messages() }}
    where
        type = 'track'
        and event_action in ('journey_started', 'journey_step_entered', 'journey_exited')
),

journey_events as (
    select
        event_id,
        account_id,
        client_id,
        brand_id,
        customer_id,
        customer_user_id as user_id,
        event_action,
        event_time,
        properties ->> '$.journeyId' as journey_id,
        properties ->> '$.instanceId' as instance_id,
        properties ->> '$.stepId' as step_id,
        try_cast(properties ->> '$.visit' as integer) as visit,
        properties ->> '$.commandEventId' as command_event_id,
        properties ->> '$.reason' as reason
    from messages
    where properties ->> '$.instanceId' is not null
),

latest_step as (
    select
        account_id,
        instance_id,
        step_id as current_step_id,
        event_time as current_step_entered_at
    from journey_events
    where event_action = 'journey_step_entered'
    qualify row_number() over (
        partition by account_id, instance_id
        order by event_time desc, visit desc nulls last, event_id desc
    ) = 1
),

instances as (
    select
        account_id,
        instance_id,
        any_value(client_id) as client_id,
        any_value(brand_id) as brand_id,
        any_value(journey_id) as journey_id,
        min(customer_id) as customer_id,
        min(user_id) as user_id,
        min(command_event_id) filter (where event_action = 'journey_started') as command_event_id,
        min(event_time) filter (where event_action = 'journey_started') as started_at,
        arg_min(step_id, event_time) filter (where event_action = 'journey_started')
            as entry_step_id,
        max(event_time) filter (where event_action = 'journey_exited') as exited_at,
        arg_max(reason, event_time) filter (where event_action = 'journey_exited') as exit_reason,
        arg_max(step_id, event_time) filter (where event_action = 'journey_exited')
            as exit_step_id,
        -- Distinct (step, visit) pairs: a transition recorded twice counts once.
        count(distinct step_id || ':' || coalesce(visit, 0)) filter (
            where event_action = 'journey_step_entered'
        ) as steps_entered
    from journey_events
    group by account_id, instance_id
),

final as (
    select
        instances.account_id,
        instances.instance_id,
        instances.client_id,
        instances.brand_id,
        instances.journey_id,
        instances.customer_id,
        instances.user_id,
        instances.command_event_id,
        instances.started_at,
        instances.entry_step_id,
        coalesce(latest_step.current_step_id, instances.exit_step_id) as current_step_id,
        latest_step.current_step_entered_at,
        case when instances.exited_at is null then 'active' else 'exited' end as status,
        instances.exited_at,
        instances.exit_reason,
        instances.steps_entered
    from instances
    left join latest_step
        on
            instances.account_id = latest_step.account_id
            and instances.instance_id = latest_step.instance_id
)

select * from final
