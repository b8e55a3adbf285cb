-- One row per (account, messageId) received more than once: how many extra copies, first and
-- last receipt, so retry storms show.
with messages as (
    select * from {{ ref('stg_messages') }}
),

final as (
    select
        account_id,
        message_id,
        count(*) - 1 as duplicate_count,
        min(received_at) as first_received_at,
        max(received_at) as last_received_at
    from messages
    group by account_id, message_id
    having count(*) > 1
)

select * from final
