-- One row per stored message: typed columns, the JSON parts messages carry, the event action,
-- an alias's previousId and a group call's groupId.
with messages as (
    select * from {{ source('raw', 'messages') }}
),

-- One parse per message for all its parts: separate `message::json -> ...` expressions parse
-- the document once each (14.6 s vs 8.6 s for 1M messages).
parts as (
    select
        *,
        json_extract(
            message, ['$.traits', '$.context', '$.properties', '$.name', '$.previousId', '$.groupId']
        ) as part
    from messages
),

final as (
    select
        event_id,
        message_id,
        client_id,
        account_id,
        brand_id,
        type,
        event,
        user_id,
        anonymous_id,
        "timestamp" as event_time,  -- noqa: RF06
        received_at,
        sent_at,
        channel,
        source,
        landing_file,
        loaded_at,
        {{ event_action('type', 'event') }} as event_action,
        case
            when type = 'track' then event
            when type = 'screen' then coalesce(part[4] ->> '$', 'screen')
            when type = 'page' then coalesce(part[4] ->> '$', 'page')
            else type
        end as event_name,
        message::json as message,
        part[1] as traits,
        part[2] as context,
        part[3] as properties,
        -- An alias's previousId, and a group call's groupId (a string or a number: as text).
        case when type = 'alias' then part[5] ->> '$' end as previous_id,
        case when type = 'group' then part[6] ->> '$' end as group_id
    from parts
)

select * from final
