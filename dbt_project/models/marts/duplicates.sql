-- One row per (account, messageId) received more than once: how many extra copies, first and
-- last receipt, so retry storms show. Incrementally, the keys of newly loaded messages are
-- counted again over all history.
{{
    config(
        materialized='incremental',
        incremental_strategy='delete+insert',
        unique_key=['account_id', 'message_id'],
    )
}}

-- Only the columns counted: the CTE is read twice, so DuckDB materializes it.
with messages as (
    select
        account_id,
        message_id,
        received_at,
        loaded_at
    from {{ ref('stg_messages') }}
),

{% if is_incremental() %}
loaded as (
    select distinct
        account_id,
        message_id
    from messages
    where {{ in_window('loaded_at') }}
),

counted as (
    select messages.*
    from messages
    semi join loaded
        on messages.account_id = loaded.account_id and messages.message_id = loaded.message_id
),
{% else %}
counted as (
    select * from messages
),
{% endif %}

final as (
    select
        account_id,
        message_id,
        count(*) - 1 as duplicate_count,
        min(received_at) as first_received_at,
        max(received_at) as last_received_at
    from counted
    group by account_id, message_id
    having count(*) > 1
)

select * from final
