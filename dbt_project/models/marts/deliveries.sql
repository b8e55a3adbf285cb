-- One row per send outcome event (grain: event_id): email_sent, email_opened, email_clicked,
-- email_bounced, sms_sent, push_sent, print_sent and every *_skipped / *_failed, which the
-- dispatcher and the email links record as track messages through the collector.
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
        and regexp_matches(
            lower(event_name),
            '^(email|sms|push|print)_(sent|opened|clicked|bounced|skipped|failed)$'
        )
),

final as (
    select
        event_id,
        message_id,
        account_id,
        brand_id,
        customer_id,
        customer_user_id as user_id,
        properties ->> '$.sendId' as send_id,
        properties ->> '$.commandEventId' as command_event_id,
        properties ->> '$.assetId' as asset_id,
        coalesce(properties ->> '$.sendType', split_part(lower(event_name), '_', 1)) as send_type,
        split_part(lower(event_name), '_', 2) as outcome,
        properties ->> '$.reason' as reason,
        properties ->> '$.journeyId' as journey_id,
        properties ->> '$.instanceId' as journey_instance_id,
        properties ->> '$.stepId' as journey_step_id,
        event_time,
        received_at
    from messages
)

select * from final
