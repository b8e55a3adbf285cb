-- Candidates for the event objects of customers: per (customer, event
-- action, end of history `first` or `last`), the first or last event of that action by event
-- time (ties: receipt, then eventId) among the messages of one pass, with the keys it is ranked
-- by.
-- The winner of each (customer, action, end) over its candidates is customer_event_winners (a
-- view), which the `customers` view splices into `metadata` as firstEvent/lastEvent.
-- A pass appends the candidates of the messages it rewrote without reading what is stored: the
-- earlier winner stays a candidate beside them (reading the stored winners of the touched
-- actions and deleting those beaten costs ~1 s of a +100k pass at 10M). Compaction folds the
-- table back to winners with the fold rule `meta.fold` declares (event_winners, as the view
-- customer_event_winners), deleting the candidates that are not winners. A rebuilt customer's candidates are deleted first and computed again
-- from all its messages; a message the pass wrote again loses its earlier candidates.
-- Row groups of 4,096 rows (schema state, as the marts), sorted by customer: a lookup of one customer reads a row
-- group of each file, not the table. On a pass its rows are written in customer_profiles'
-- commit (`commit_with`): the view never combines a pass's objects with the profiles of the pass
-- before.
{{
    config(
        materialized='incremental_by_customer',
        customers_per_chunk=env_var('MALLARD_CUSTOMERS_PER_CHUNK', '125000') | int,
        appends_candidates=true,
        message_column='event_id',
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

candidates as (
    select
        customer_id,
        event_action,
        arg_min(event_id, {{ event_order('event_id') }}) as first_event_id,
        arg_max(event_id, {{ event_order('event_id') }}) as last_event_id
    from messages
    group by customer_id, event_action
),

ends as (
    select
        customer_id,
        event_action,
        'first' as end_of_history,
        first_event_id as event_id
    from candidates
    union all
    select
        customer_id,
        event_action,
        'last' as end_of_history,
        last_event_id as event_id
    from candidates
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
    inner join messages
        on ends.customer_id = messages.customer_id and ends.event_id = messages.event_id
    order by ends.customer_id, ends.event_action, ends.end_of_history
)

select * from final
