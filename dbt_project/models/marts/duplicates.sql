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

{% if is_incremental() -%}
{{ set_hash_bits(
    'mallard_loaded_message_bits',
    'select message_id from ' ~ ref('stg_messages') ~ ' where ' ~ in_window('loaded_at')
) }}
{%- endif %}

with
{% if is_incremental() %}
loaded as (
    select distinct
        account_id,
        message_id
    from {{ ref('stg_messages') }}
    where {{ in_window('loaded_at') }}
),

-- Every stored copy of the loaded keys, found behind a bitmap of them (see hash_bits_filter)
-- in the scan: a semi join alone (through a CTE both selects shared) read every stored
-- message's columns, 1.75 s of a 100k-message pass at 10M.
counted as (
    select
        messages.account_id,
        messages.message_id,
        messages.received_at
    from {{ ref('stg_messages') }} as messages
    semi join loaded
        on messages.account_id = loaded.account_id and messages.message_id = loaded.message_id
    where {{ hash_bits_filter('mallard_loaded_message_bits', 'messages.message_id') }}
),
{% else %}
counted as (
    select
        account_id,
        message_id,
        received_at
    from {{ ref('stg_messages') }}
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
