-- One row per served customer (grain: customer_id): the traits object and the metadata object of
-- INTERFACE.md 2.9, with typed columns for lookups.
with messages as (
    select * from {{ ref('int_messages_identified') }}
),

traits as (
    select * from {{ ref('int_customer_traits') }}
),

regulations as (
    select * from {{ ref('regulation_state') }}
),

base as (
    select
        customer_id,
        account_id,
        any_value(client_id) as client_id,
        max(customer_user_id) as user_id,
        arg_min(landing_file, (received_at, event_id)) as created_file,
        arg_min(channel, (received_at, event_id)) as created_channel,
        min(received_at) as created_time,
        max(event_time) as last_activity_time
    from messages
    group by customer_id, account_id
),

event_objects as (
    select
        customer_id,
        event_action,
        event_time,
        received_at,
        event_id,
        json_object(
            'eventId', event_id,
            'receivedTime', {{ iso_ts('received_at') }},
            'context', context,
            'sendType', properties ->> '$.sendType',
            'eventTime', {{ iso_ts('event_time') }},
            'action', type,
            'event', event_name,
            'userId', customer_user_id,
            'properties', properties,
            'timestamp', {{ iso_ts('event_time') }}
        ) as event_object
    from messages
),

first_last_by_action as (
    select
        customer_id,
        event_action,
        arg_min(event_object, (event_time, received_at, event_id)) as first_event,
        arg_max(event_object, (event_time, received_at, event_id)) as last_event
    from event_objects
    group by customer_id, event_action
),

first_last as (
    select
        customer_id,
        json_group_object(event_action, first_event) as first_event,
        json_group_object(event_action, last_event) as last_event
    from first_last_by_action
    group by customer_id
),

assembled as (
    select
        base.*,
        {{ subscription_id('base.customer_id') }} as subscription_id,
        json_merge_patch(
            traits.traits,
            json_object(
                'id', base.customer_id,
                'externalId', base.user_id,
                'marketingPreferences',
                (
                    select preferences.marketing_preferences
                    from {{ ref('int_customer_preferences') }} as preferences
                    where preferences.customer_id = base.customer_id
                )
            )
        ) as traits_object,
        first_last.first_event,
        first_last.last_event
    from base
    inner join traits on base.customer_id = traits.customer_id
    inner join first_last on base.customer_id = first_last.customer_id
    anti join regulations
        on
            base.account_id = regulations.account_id
            and base.user_id = regulations.user_id
),

final as (
    select
        customer_id,
        client_id,
        account_id,
        user_id,
        lower(traits_object ->> '$.email') as email_lower,
        subscription_id,
        traits_object as traits,
        json_merge_patch(
            traits_object,
            json_object(
                '_subscriptionId', subscription_id,
                'createdBy', json_object(
                    'filename', created_file,
                    'createdTime', {{ iso_ts('created_time') }},
                    'type', created_channel
                ),
                'firstEvent', first_event,
                'lastEvent', last_event,
                'audiencesStatic', '[]'::json,
                'lastActivityTime', {{ iso_ts('last_activity_time') }}
            )
        ) as metadata,
        created_time,
        last_activity_time
    from assembled
    order by account_id, user_id, customer_id
)

select * from final
