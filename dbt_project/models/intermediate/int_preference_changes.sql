-- One row per (message, preference key) it sets: a channel, a category or unsubscribe-all,
-- set by a preferences update (track `preferences_updated` / `unsubscribed` written by the
-- preferences endpoint, source `preferences`) or by an identify trait `marketingPreferences`.
-- customer_profiles picks the latest change per key by event time from these rows,
-- whichever path a change came by. Incrementally, the rows of the messages a pass rewrote are
-- replaced.
{{
    config(
        materialized='incremental',
        incremental_strategy='per_message',
        unique_key=['account_id', 'message_id'],
    )
}}

-- Only the messages and columns used: the CTE is read twice, so DuckDB materializes it.
with messages as (
    select
        customer_id,
        account_id,
        event_time,
        received_at,
        message_id,
        event_id,
        type,
        source,
        event_action,
        properties,
        traits,
        pass_through
    from {{ ref('int_messages_identified') }}
    {{ where_rewritten() }}
    -- Only the messages that can carry a change: a cheap filter before the JSON is read.
    and type in ('track', 'identify')
),

updates as (
    -- Only the endpoint's own messages: a client's track named `unsubscribed` (an ESP webhook,
    -- say) is an event, not a preference change.
    select *
    from messages
    where
        type = 'track'
        and source = 'preferences'
        and event_action in ('preferences_updated', 'unsubscribed')
),

identifies as (
    select
        *,
        traits -> '$.marketingPreferences' as prefs
    from messages
    where
        type = 'identify'
        and json_type(traits -> '$.marketingPreferences') = 'OBJECT'
),

update_items as (
    select
        customer_id,
        account_id,
        event_time,
        received_at,
        message_id,
        event_id,
        'channel' as pref_kind,
        unnest(properties -> '$.channels[*]') as item
    from updates
    union all
    select
        customer_id,
        account_id,
        event_time,
        received_at,
        message_id,
        event_id,
        'category' as pref_kind,
        unnest(properties -> '$.categories[*]') as item
    from updates
),

update_changes as (
    select
        customer_id,
        account_id,
        pref_kind,
        item ->> ('$.' || pref_kind) as pref_key,
        (item -> '$.subscribed')::boolean as pref_value,
        event_time,
        received_at,
        message_id,
        event_id,
        'preferences' as origin
    from update_items
    where json_type(item -> '$.subscribed') = 'BOOLEAN'
    union all
    select
        customer_id,
        account_id,
        'unsubscribe_all' as pref_kind,
        '' as pref_key,
        (properties -> '$.unsubscribeAll')::boolean as pref_value,
        event_time,
        received_at,
        message_id,
        event_id,
        'preferences' as origin
    from updates
    where json_type(properties -> '$.unsubscribeAll') = 'BOOLEAN'
),

identify_items as (
    select
        customer_id,
        account_id,
        event_time,
        received_at,
        message_id,
        event_id,
        'channel' as pref_kind,
        unnest(prefs -> '$.channels[*]') as item
    from identifies
    union all
    select
        customer_id,
        account_id,
        event_time,
        received_at,
        message_id,
        event_id,
        'category' as pref_kind,
        unnest(prefs -> '$.categories[*]') as item
    from identifies
),

identify_listed as (
    select
        customer_id,
        account_id,
        event_time,
        received_at,
        message_id,
        event_id,
        pref_kind,
        item ->> ('$.' || pref_kind) as pref_key,
        bool_or((item -> '$.subscribed')::boolean) as pref_value
    from identify_items
    where json_type(item -> '$.subscribed') = 'BOOLEAN'
    group by all
),

interface_channels as (
    select unnest(['email', 'sms', 'whatsapp', 'facebook', 'push']) as pref_key
),

identify_unlisted_channels as (
    -- An array trait is replaced whole and channels are opt-in: a
    -- channel the identify's `channels` array leaves out is unsubscribed by it.
    select
        identifies.customer_id,
        identifies.account_id,
        identifies.event_time,
        identifies.received_at,
        identifies.message_id,
        identifies.event_id,
        'channel' as pref_kind,
        interface_channels.pref_key,
        false as pref_value
    from identifies
    cross join interface_channels
    where
        json_type(identifies.prefs -> '$.channels') = 'ARRAY'
        and not exists (
            select 1
            from identify_listed
            where
                identify_listed.event_id = identifies.event_id
                and identify_listed.pref_kind = 'channel'
                and identify_listed.pref_key = interface_channels.pref_key
        )
),

identify_changes as (
    select
        *,
        'identify' as origin
    from identify_listed
    union all
    select
        *,
        'identify' as origin
    from identify_unlisted_channels
    union all
    select
        customer_id,
        account_id,
        event_time,
        received_at,
        message_id,
        event_id,
        'unsubscribe_all' as pref_kind,
        '' as pref_key,
        (prefs -> '$.unsubscribeAll')::boolean as pref_value,
        'identify' as origin
    from identifies
    where json_type(prefs -> '$.unsubscribeAll') = 'BOOLEAN'
),

changes as (
    select * from update_changes
    where pref_key is not null
    union all by name
    select * from identify_changes
    where pref_key is not null
),

final as (
    select
        changes.*,
        messages.pass_through
    from changes
    inner join messages on changes.event_id = messages.event_id
)

select * from final
