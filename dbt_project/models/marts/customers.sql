-- One row per served customer (grain: customer_id): the traits object and the metadata object of
-- INTERFACE.md 2.9, with typed columns for lookups.
{{
    config(
        materialized='incremental_by_customer',
        customers_per_chunk=env_var('MALLARD_CUSTOMERS_PER_CHUNK', '125000') | int,
    )
}}

-- Incremental passes fold the messages a pass rewrote into each changed customer's stored row
-- (see merging() in macros/incremental_window.sql): created and last activity by min and max,
-- firstEvent/lastEvent from the winners of int_customer_event_winners: the members of the winners
-- a pass changed are built from the rewritten messages and replace theirs in the stored objects.

-- Only the columns used: the CTE is read twice, so DuckDB materializes it.
with messages as (
    {{ merge_input(ref('int_messages_identified'), [
        "customer_id",
        "account_id",
        "client_id",
        "customer_user_id",
        "landing_file",
        "channel",
        "event_id",
        "event_time",
        "received_at",
        "event_action",
        "type",
        "event_name",
        "context",
        "properties",
    ]) }}
),

winners as (
    select * from {{ ref('int_customer_event_winners') }}
    {{ where_customer_changed(rewritten=true) }}
),

traits as (
    select * from {{ ref('int_customer_traits') }}
    {{ where_customer_changed(rewritten=true) }}
),

preferences as (
    select * from {{ ref('int_customer_preferences') }}
    {{ where_customer_changed(rewritten=true) }}
),

regulations as (
    select * from {{ ref('regulation_state') }}
),

{% if merging() -%}
-- Used by first_last on passes (the noqa: sqlfluff also lints a mix of the two builds).
stored as (  -- noqa: ST03
    select
        customer_id,
        account_id,
        client_id,
        user_id,
        created_time,
        created_event_id,
        last_activity_time,
        -- One parse of each stored object for all its parts.
        json_extract(
            metadata, ['$.createdBy.filename', '$.createdBy.type', '$.firstEvent', '$.lastEvent']
        ) as parts
    from {{ this }}
    {{ where_stored_merged() }}
),
{%- endif %}

partial_base as (
    select
        customer_id,
        account_id,
        any_value(client_id) as client_id,
        max(customer_user_id) as user_id,
        arg_min(landing_file, (received_at, event_id)) as created_file,
        arg_min(channel, (received_at, event_id)) as created_channel,
        min(received_at) as created_time,
        arg_min(event_id, (received_at, event_id)) as created_event_id,
        max(event_time) as last_activity_time
    from messages
    group by customer_id, account_id
    {% if merging() -%}
    union all
    select
        customer_id,
        account_id,
        client_id,
        user_id,
        parts[1] ->> '$' as created_file,
        parts[2] ->> '$' as created_channel,
        created_time,
        created_event_id,
        last_activity_time
    from stored
    {%- endif %}
),

base as (
    select
        customer_id,
        account_id,
        any_value(client_id) as client_id,
        max(user_id) as user_id,
        arg_min(created_file, (created_time, created_event_id)) as created_file,
        arg_min(created_channel, (created_time, created_event_id)) as created_channel,
        min(created_time) as created_time,
        arg_min(created_event_id, (created_time, created_event_id)) as created_event_id,
        max(last_activity_time) as last_activity_time
    from partial_base
    group by customer_id, account_id
),

winner_ids as (
    select first_event_id as event_id from winners
    union
    select last_event_id as event_id from winners
),

-- The JSON objects only for the winners: carrying every message's object through the
-- aggregates ran out of memory (18.8 GiB) at 10M messages.
event_objects as (
    select
        messages.event_id,
        -- Patched onto {} to drop null members at any depth, as the metadata object has them.
        json_merge_patch('{}', json_object(
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
        )) as event_object
    from messages
    semi join winner_ids on messages.event_id = winner_ids.event_id
),

-- The firstEvent/lastEvent members this build makes: every winner's on a full build; on a pass,
-- those of the winners the pass changed (their event is among the rewritten messages), with an
-- object that removes them from the stored objects.
{% for end_of_history in ['first', 'last'] -%}
{{ end_of_history }}_changes as (
    select
        winners.customer_id,
        {{ json_object_agg('winners.event_action', 'objects.event_object', sorted=false) }}
            as objects,
        {{ json_object_agg('winners.event_action', "'null'", sorted=false)
            if merging() else 'null::json' }} as removals
    from winners
    inner join event_objects as objects
        on winners.{{ end_of_history }}_event_id = objects.event_id
    group by winners.customer_id
),

{% endfor -%}
{% if merging() -%}
-- On a pass, the changed members replace theirs in the stored objects (removed, then set: a
-- merge patch alone would merge an old event object into the new one), and the others stay as
-- stored. No stored object is taken apart into rows and aggregated again: at 10M messages that
-- took the customers model 17 s a pass, this 11 s.
first_last as (
    select
        base.customer_id,
        {% for end_of_history, part in [('first', 3), ('last', 4)] -%}
        case
            -- No member changed (most customers' firstEvent): the stored object, unparsed.
            when {{ end_of_history }}_changes.customer_id is null
                then coalesce(stored.parts[{{ part }}], '{}')
            -- Built whole (rebuilt or new customer): every member is a change.
            when stored.customer_id is null then {{ end_of_history }}_changes.objects
            else json_merge_patch(
                stored.parts[{{ part }}],
                {{ end_of_history }}_changes.removals,
                {{ end_of_history }}_changes.objects
            )
        end as {{ end_of_history }}_event
        {%- if not loop.last %},{% endif %}
        {% endfor %}
    from base
    left join stored on base.customer_id = stored.customer_id
    left join first_changes on base.customer_id = first_changes.customer_id
    left join last_changes on base.customer_id = last_changes.customer_id
),
{%- else %}
first_last as (
    select
        base.customer_id,
        first_changes.objects as first_event,
        last_changes.objects as last_event
    from base
    inner join first_changes on base.customer_id = first_changes.customer_id
    inner join last_changes on base.customer_id = last_changes.customer_id
),
{%- endif %}

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

metadata_heads as (
    select
        *,
        json_merge_patch(
            traits_object,
            json_object(
                -- Null: a trait of these names gives way to the spliced-in objects.
                'firstEvent', null,
                'lastEvent', null,
                '_subscriptionId', subscription_id,
                'createdBy', json_object(
                    'filename', created_file,
                    'createdTime', {{ iso_ts('created_time') }},
                    'type', created_channel
                ),
                'audiencesStatic', '[]'::json,
                'lastActivityTime', {{ iso_ts('last_activity_time') }}
            )
        )::varchar as metadata_head
    from traits_objects
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
        -- firstEvent/lastEvent (most of the object's bytes) are spliced in as text: a patch
        -- parses and writes its whole input again (seconds per 100k customers).
        (
            left(metadata_head, length(metadata_head) - 1)
            || ',"firstEvent":' || first_event::varchar
            || ',"lastEvent":' || last_event::varchar
            || '}'
        )::json as metadata,
        created_time,
        created_event_id,
        last_activity_time
    from metadata_heads
    -- Sorted, on passes too: unsorted, a pass's new customers (often anonymous visitors) came
    -- out together and filled whole row groups with null user_ids (test ducklake_stats_complete).
    -- Not by user_id: anonymous customers' null user_ids would fill whole row groups, and
    -- DuckLake (1.5.5) then records no min/max for the file's user_id and prunes that file from
    -- every `where user_id = ...` once another file has stats (customers silently not found).
    order by account_id, customer_id
)

select * from final
