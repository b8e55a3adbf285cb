-- One row per deduplicated message, attributed to its customer: its userId, else the userId its
-- anonymousId was (ever, before or after) identified with, else the anonymous visitor itself.
with messages as (
    select * from {{ ref('int_messages_deduped') }}
),

identity_map as (
    select * from {{ ref('int_identity_map') }}
),

resolved as (
    select
        messages.*,
        coalesce(messages.user_id, identity_map.user_id) as customer_user_id,
        case
            when coalesce(messages.user_id, identity_map.user_id) is not null
                then 'user:' || coalesce(messages.user_id, identity_map.user_id)
            else 'anon:' || messages.anonymous_id
        end as customer_key
    from messages
    -- Equality conditions only: an extra `messages.user_id is null` here turned the hash join
    -- into a nested loop (229 s for 1M messages); coalesce already prefers the message's userId.
    left join identity_map
        on
            messages.account_id = identity_map.account_id
            and messages.anonymous_id = identity_map.anonymous_id
),

final as (
    select
        *,
        {{ customer_id('account_id', 'customer_key') }} as customer_id
    from resolved
)

select * from final
