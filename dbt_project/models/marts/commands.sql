-- One row per deduplicated command message (grain: event_id): a track whose event, in any
-- case, is send_email, send_sms, send_push, send_print or start_journey. `merge_data` is the
-- stored message's root keys as JSON (every root key is merge data for the asset). The
-- dispatcher (orchestration/delivery/dispatch.py) reads the rows it has not yet planned.
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
    where
        type = 'track'
        and lower(event_name) in (
            'send_email', 'send_sms', 'send_push', 'send_print', 'start_journey'
        )
),

raw_messages as (
    select
        event_id,
        message
    from {{ source('raw', 'messages') }}
    where event_id in (select messages.event_id from messages)
),

final as (
    select
        messages.event_id,
        messages.message_id,
        messages.client_id,
        messages.account_id,
        messages.brand_id,
        messages.customer_id,
        messages.customer_user_id as user_id,
        lower(messages.event_name) as command,
        raw_messages.message::json ->> '$.assetId' as asset_id,
        messages.properties ->> '$.journeyIdToTrigger' as journey_id,
        raw_messages.message::json as merge_data,
        messages.event_time,
        messages.received_at
    from messages
    inner join raw_messages on messages.event_id = raw_messages.event_id
)

select * from final
