-- One row per (customer, event action, end of history) of a served customer: the event object
-- (INTERFACE.md 2.9) of the customer's first or last event of that action by event time (ties:
-- receipt, then eventId), with the keys it won by. The `customers` view splices them into
-- `metadata` as firstEvent/lastEvent, keyed by event action.
-- The mart is its own fold state: a pass compares the messages it rewrote with the stored
-- winners of the actions they touch, and writes only the objects whose winner is among those
-- messages (a new winner, or the old one written again), and every object of a rebuilt customer:
-- at 10M messages, +100k events, ~0.1M small rows. (Until 2026-11-25 the winners were a table of
-- their own, int_customer_event_winners, written for every touched action and read back here.)
-- Like customer_profiles, it holds served customers only: a customer that stops being served
-- loses its rows, and one served again must be rebuilt (int_customers_changed.rebuild).
-- A mart (row groups of 4,096 rows), sorted by customer: the view's lookup of one customer reads
-- a row group of each file, not the table. On a pass its rows are written in customer_profiles'
-- commit (`commit_with`): the view never combines a pass's objects with the profiles of the pass
-- before.
{{
    config(
        materialized='incremental_by_customer',
        customers_per_chunk=env_var('MALLARD_CUSTOMERS_PER_CHUNK', '125000') | int,
        customer_key='event_action, end_of_history',
        commit_with='customer_profiles',
    )
}}

with messages as (
    {{ merge_input(ref('int_messages_identified'), [
        "customer_id",
        "event_action",
        "account_id",
        "event_id",
        "customer_user_id",
        "event_time",
        "received_at",
        "type",
        "event_name",
        "context",
        "properties",
    ]) }}
),

-- The pass's messages, and the stored winners of the (customer, action) pairs they touch.
candidates as (
    select
        customer_id,
        event_action,
        event_id,
        event_time,
        received_at
    from messages
    {{ union_stored_state([
        "customer_id",
        "event_action",
        "event_id",
        "event_time",
        "received_at",
    ], key='event_action', messages=ref('int_messages_identified')) }}
),

winners as (
    select
        customer_id,
        event_action,
        arg_min(event_id, (event_time, received_at, event_id)) as first_event_id,
        arg_max(event_id, (event_time, received_at, event_id)) as last_event_id
    from candidates
    group by customer_id, event_action
),

regulations as (
    select * from {{ ref('regulation_state') }}
),

ends as (
    select
        customer_id,
        event_action,
        'first' as end_of_history,
        first_event_id as event_id
    from winners
    union all
    select
        customer_id,
        event_action,
        'last' as end_of_history,
        last_event_id as event_id
    from winners
),

final as (
    select
        ends.customer_id,
        ends.event_action,
        ends.end_of_history,
        ends.event_id,
        messages.event_time,
        messages.received_at,
        -- Patched onto {} to drop null members at any depth, as the metadata object has them.
        json_merge_patch('{}', json_object(
            'eventId', messages.event_id,
            'receivedTime', {{ iso_ts('messages.received_at') }},
            'context', messages.context,
            'sendType', messages.properties ->> '$.sendType',
            'eventTime', {{ iso_ts('messages.event_time') }},
            'action', messages.type,
            'event', messages.event_name,
            'userId', messages.customer_user_id,
            'properties', messages.properties,
            'timestamp', {{ iso_ts('messages.event_time') }}
        )) as event_object
    from ends
    -- Only the winners whose event the pass rewrote: the others' stored objects stay as they are.
    inner join messages
        on ends.customer_id = messages.customer_id and ends.event_id = messages.event_id
    anti join regulations
        on
            messages.account_id = regulations.account_id
            and messages.customer_user_id = regulations.user_id
    order by ends.customer_id, ends.event_action, ends.end_of_history
)

select * from final
