-- One row per deduplicated message the pass (re)writes: new in its window, attributed again, a
-- replaced copy, or left by a pass that died. A per-message model reads these on an incremental
-- pass (macro pass_messages()), and its rows of these messages are replaced (strategy
-- per_message). Ephemeral: a constant filter on the messages' `pass_through`, which DuckDB
-- answers from the files' min/max.
{{ config(materialized='ephemeral') }}

with messages as (
    select * from {{ ref('int_messages_identified') }}
),

final as (
    select * from messages
    where {{ in_window('pass_through') }}
)

select * from final
