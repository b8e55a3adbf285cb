-- One row per (served customer, event action, end of history `first` or `last`): the event object
-- (INTERFACE.md 2.9) of the customer's first or last event of that action by event time (ties:
-- receipt, then eventId), the winner among its candidates in customer_event_objects. The
-- `customers` view splices these into `metadata` as firstEvent/lastEvent; compaction deletes the
-- candidates that are not winners here (orchestration/maintenance.py). A view: the rule has this
-- one definition. The winners are ranked on the keys alone, then their rows taken whole: an
-- aggregate holding every event object would hold the table in memory on a full scan (its
-- aggregates cannot spill). A lookup by customer_id reaches every scan.
{{ config(materialized='view') }}

with candidates as (
    select * from {{ ref('customer_event_objects') }}
),

winners as (
    select
        customer_id,
        event_action,
        end_of_history,
        arg_min(event_id, {{ event_order('event_id') }}) as event_id
    from candidates
    where end_of_history = 'first'
    group by customer_id, event_action, end_of_history
    union all
    select
        customer_id,
        event_action,
        end_of_history,
        arg_max(event_id, {{ event_order('event_id') }}) as event_id
    from candidates
    where end_of_history = 'last'
    group by customer_id, event_action, end_of_history
),

final as (
    select candidates.*
    from candidates
    semi join winners
        on
            candidates.customer_id = winners.customer_id
            and candidates.event_action = winners.event_action
            and candidates.end_of_history = winners.end_of_history
            and candidates.event_id = winners.event_id
)

select * from final
