-- One row per (customer, event action, end of history `first` or `last`): the event object
-- of the customer's first or last event of that action by event time (ties:
-- receipt, then eventId), the winner among its candidates in customer_event_objects. Fold rule
-- event_winners (macros/folds.sql), which compaction also uses to delete the candidates that are
-- not winners. At 10M messages a lookup by customer_id takes ~60 ms: the filter reaches the scan
-- through the window's partition.
{{ config(materialized='view') }}

with winners as (
    select * from {{ fold_rule('event_winners', ref('customer_event_objects')) }}
),

final as (
    select * from winners
)

select * from final
