-- One row per served customer (grain: customer_id): the traits object and the metadata object of
-- INTERFACE.md 2.9, with typed columns for lookups.
{{
    config(
        materialized='incremental_by_customer',
        customers_per_chunk=env_var('MALLARD_CUSTOMERS_PER_CHUNK', '125000') | int,
    )
}}

-- Only the columns used: the CTE is read three times, so DuckDB materializes it.
with messages as (
    select
        customer_id,
        account_id,
        client_id,
        customer_user_id,
        landing_file,
        channel,
        event_id,
        event_time,
        received_at,
        event_action,
        type,
        event_name,
        context,
        properties
    from {{ ref('int_messages_identified') }}
    {{ where_customer_changed() }}
),

traits as (
    select * from {{ ref('int_customer_traits') }}
    {{ where_customer_changed() }}
),

preferences as (
    select * from {{ ref('int_customer_preferences') }}
    {{ where_customer_changed() }}
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

-- Winners first, on narrow columns; the JSON objects only for the winners. Carrying every
-- message's object through arg_min/arg_max ran out of memory (18.8 GiB) at 10M messages.
first_last_ids as (
    select
        customer_id,
        event_action,
        arg_min(event_id, (event_time, received_at, event_id)) as first_event_id,
        arg_max(event_id, (event_time, received_at, event_id)) as last_event_id
    from messages
    group by customer_id, event_action
),

winners as (
    select first_event_id as event_id from first_last_ids
    union
    select last_event_id as event_id from first_last_ids
),

event_objects as (
    select
        messages.event_id,
        json_object(
            'eventId', messages.event_id,
            'receivedTime', {{ iso_ts('messages.received_at') }},
            'context', messages.context,
            'sendType', messages.properties ->> '$.sendType',
            'eventTime', {{ iso_ts('messages.event_time') }},
            'action', messages.type,
            'event', messages.event_name,
            'userId', messages.customer_user_id,
            'properties', messages.properties,
            'timestamp', {{ iso_ts('messages.event_time') }}
        ) as event_object
    from messages
    semi join winners on messages.event_id = winners.event_id
),

first_last as (
    select
        first_last_ids.customer_id,
        json_group_object(first_last_ids.event_action, first_objects.event_object)
            as first_event,
        json_group_object(first_last_ids.event_action, last_objects.event_object)
            as last_event
    from first_last_ids
    inner join event_objects as first_objects
        on first_last_ids.first_event_id = first_objects.event_id
    inner join event_objects as last_objects
        on first_last_ids.last_event_id = last_objects.event_id
    group by first_last_ids.customer_id
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
                'marketingPreferences', preferences.marketing_preferences
            )
        ) as patched_traits,
        first_last.first_event,
        first_last.last_event
    from base
    inner join traits on base.customer_id = traits.customer_id
    inner join first_last on base.customer_id = first_last.customer_id
    inner join preferences on base.customer_id = preferences.customer_id
    anti join regulations
        on
            base.account_id = regulations.account_id
            and base.user_id = regulations.user_id
),

traits_objects as (
    select
        *,
        -- The patch drops keys patched with null, yet an anonymous customer's traits still show
        -- `"externalId": null` (INTERFACE.md 2.9): put it back in front of the object.
        case
            when user_id is null
                then ('{"externalId":null,' || substr(patched_traits::varchar, 2))::json
            else patched_traits
        end as traits_object
    from assembled
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
    from traits_objects
    -- Not by user_id: anonymous customers' null user_ids would fill whole row groups, and
    -- DuckLake (1.5.5) then records no min/max for the file's user_id and prunes that file from
    -- every `where user_id = ...` once another file has stats (customers silently not found).
    order by account_id, customer_id
)

select * from final
