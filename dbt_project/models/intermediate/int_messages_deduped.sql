-- One row per (account, messageId): the first received copy wins, over all history.
with messages as (
    select * from {{ ref('stg_messages') }}
),

final as (
    select *
    from messages
    qualify row_number() over (
        partition by account_id, message_id
        order by received_at, event_id
    ) = 1
)

select * from final
