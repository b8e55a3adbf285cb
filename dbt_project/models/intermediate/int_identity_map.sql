-- One row per (account, anonymousId) that was ever seen with a userId: the first userId it was
-- identified with (by event time; ties by receipt, then messageId). Two userIds never merge.
with messages as (
    select * from {{ ref('int_messages_deduped') }}
),

pairs as (
    select
        account_id,
        anonymous_id,
        user_id,
        event_time,
        received_at,
        message_id
    from messages
    where anonymous_id is not null and user_id is not null
),

final as (
    select
        account_id,
        anonymous_id,
        arg_min(user_id, (event_time, received_at, message_id)) as user_id,
        min(event_time) as identified_at
    from pairs
    group by account_id, anonymous_id
)

select * from final
