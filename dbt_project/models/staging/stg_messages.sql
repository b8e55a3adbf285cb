-- One row per stored message: typed columns, the JSON parts messages carry, the event action.
with messages as (
    select * from {{ source('raw', 'messages') }}
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
            when type = 'screen' then coalesce(message::json ->> '$.name', 'screen')
            when type = 'page' then coalesce(message::json ->> '$.name', 'page')
            else type
        end as event_name,
        message::json as message,
        message::json -> '$.traits' as traits,
        message::json -> '$.context' as context,
        message::json -> '$.properties' as properties
    from messages
)

select * from final
