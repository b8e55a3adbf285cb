-- One row per customer (grain: customer_id): the traits object, the columns the metadata
-- object is made of, typed columns for lookups, and the customer's marketing
-- preferences (the customer_preferences view). The `customers` view assembles `metadata` from
-- them and the firstEvent/lastEvent members in customer_event_objects: those are most of a
-- customer's metadata (4.7 of 5.3 KB at 10M messages) and a pass changes few of them, so they are
-- not written again with every changed customer. Nor is the rest of the metadata object (a
-- patched copy of the traits): the view assembles it from these columns.
{{
    config(
        materialized='incremental_by_customer',
        customers_per_chunk=env_var('MALLARD_CUSTOMERS_PER_CHUNK', '125000') | int,
    )
}}

-- Writes the pass's customer_event_objects in its own commit (their `commit_with`).
-- depends_on: {{ ref('customer_event_objects') }}

-- Incremental passes fold the messages a pass rewrote into each changed customer's stored row
-- (see merging() in macros/fold_state.sql): created (and the home brand, the brand of
-- the first message received), the first anonymousId and last activity by min and max. The
-- marketing preferences come from the changes of the changed customers, read whole (few): per
-- key (a channel, a category, unsubscribe-all) the change with the latest event time wins (ties:
-- later receipt, then messageId), whether it came by the preferences endpoint or by an identify
-- trait. Only keys ever set appear: defaults (channels opt-in, categories opt-out) are applied
-- against the brand's configured choices where those are known (the API). The winners live in
-- this row, not a model of their own that each pass would write again for every changed customer.

-- The customer's group (`group_id`, metadata `groupId`) is the groupId of its latest group call
-- by event time (ties: later receipt, then messageId); `group_call` keeps that call's keys, which
-- a pass's messages are folded against.

-- createdBy's filename (created_file) is the landing file, or for a row of `mallard import`
-- (channel import) the imported file's name, which its context carries.
with messages as (
    {{ merge_input(ref('int_messages_identified'), [
        "customer_id",
        "account_id",
        "client_id",
        "customer_user_id",
        "brand_id",
        "anonymous_id",
        "case when channel = 'import' then coalesce(context ->> '$.mallardImport.filename',"
        ~ " landing_file) else landing_file end as landing_file",
        "channel",
        "event_id",
        "event_time",
        "received_at",
        "message_id",
        "type",
        "group_id",
    ]) }}
),

traits as (
    select * from {{ ref('int_customer_traits') }}
    {{ where_customer_changed(rewritten=true) }}
),

changes as (
    select * from {{ ref('int_preference_changes') }}
    {{ where_customer_changed() }}
),

partial_base as (
    select
        customer_id,
        account_id,
        any_value(client_id) as client_id,
        max(customer_user_id) as user_id,
        arg_min(landing_file, (received_at, event_id)) as created_file,
        arg_min(channel, (received_at, event_id)) as created_channel,
        arg_min(brand_id, (received_at, event_id)) as home_brand_id,
        min(received_at) as created_time,
        arg_min(event_id, (received_at, event_id)) as created_event_id,
        arg_min(anonymous_id, (received_at, event_id)) filter (
            where anonymous_id is not null
        ) as anonymous_id,
        min(received_at) filter (where anonymous_id is not null) as anonymous_received_at,
        arg_min(event_id, (received_at, event_id)) filter (
            where anonymous_id is not null
        ) as anonymous_event_id,
        max(event_time) as last_activity_time,
        arg_max(
            {
                'group_id': group_id,
                'event_time': event_time,
                'received_at': received_at,
                'message_id': message_id
            },
            {{ event_order() }}
        ) filter (where type = 'group' and group_id is not null) as group_call
    from messages
    group by customer_id, account_id
    {% if merging() -%}
    union all
    select
        customer_id,
        account_id,
        client_id,
        user_id,
        created_file,
        created_channel,
        home_brand_id,
        created_time,
        created_event_id,
        anonymous_id,
        anonymous_received_at,
        anonymous_event_id,
        last_activity_time,
        group_call
    from {{ this }}
    {{ where_stored_merged() }}
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
        arg_min(home_brand_id, (created_time, created_event_id)) as home_brand_id,
        min(created_time) as created_time,
        arg_min(created_event_id, (created_time, created_event_id)) as created_event_id,
        arg_min(anonymous_id, (anonymous_received_at, anonymous_event_id)) filter (
            where anonymous_id is not null
        ) as anonymous_id,
        min(anonymous_received_at) as anonymous_received_at,
        arg_min(anonymous_event_id, (anonymous_received_at, anonymous_event_id)) filter (
            where anonymous_id is not null
        ) as anonymous_event_id,
        max(last_activity_time) as last_activity_time,
        arg_max(
            group_call,
            (group_call['event_time'], group_call['received_at'], group_call['message_id'])
        ) filter (where group_call is not null) as group_call
    from partial_base
    group by customer_id, account_id
),

latest_changes as (
    -- (event time, receipt, messageId) is unique per customer and key: one winner each.
    select
        customer_id,
        pref_kind,
        pref_key,
        arg_max(pref_value, {{ event_order() }}) as pref_value,
        max(event_time) as event_time,
        arg_max(received_at, {{ event_order() }}) as received_at,
        arg_max(message_id, {{ event_order() }}) as message_id
    from changes
    group by customer_id, pref_kind, pref_key
),

preferences as (
    select
        customer_id,
        json_object(
            'channels', coalesce(
                to_json(list(
                    json_object('channel', pref_key, 'subscribed', pref_value) order by pref_key
                ) filter (where pref_kind = 'channel')),
                '[]'::json
            ),
            'categories', coalesce(
                to_json(list(
                    json_object('category', pref_key, 'subscribed', pref_value) order by pref_key
                ) filter (where pref_kind = 'category')),
                '[]'::json
            ),
            'unsubscribeAll', coalesce(
                bool_or(pref_value) filter (where pref_kind = 'unsubscribe_all'), false
            )
        ) as marketing_preferences,
        -- Each key's winning change with its ordering, so the API can overlay changes it
        -- accepted after this build by the same rule (see api/preferences.py).
        to_json(list(
            json_object(
                'kind', pref_kind,
                'key', pref_key,
                'value', pref_value,
                'eventTime', {{ iso_ts('event_time') }},
                'receivedAt', {{ iso_ts('received_at') }},
                'messageId', message_id
            )
            order by pref_kind, pref_key
        )) as preference_state
    from latest_changes
    group by customer_id
),

assembled as (
    select
        base.*,
        {{ subscription_id('base.customer_id') }} as subscription_id,
        coalesce(
            preferences.marketing_preferences,
            '{"channels":[],"categories":[],"unsubscribeAll":false}'::json
        ) as marketing_preferences,
        coalesce(preferences.preference_state, '[]'::json) as preference_state,
        json_merge_patch(
            traits.traits,
            json_object(
                'id', base.customer_id,
                'externalId', base.user_id,
                'marketingPreferences', coalesce(
                    preferences.marketing_preferences,
                    '{"channels":[],"categories":[],"unsubscribeAll":false}'::json
                )
            )
        ) as patched_traits
    from base
    inner join traits on base.customer_id = traits.customer_id
    left join preferences on base.customer_id = preferences.customer_id
),

traits_objects as (
    select
        *,
        -- The patch drops keys patched with null, yet an anonymous customer's traits still show
        -- `"externalId": null`: put it back in front of the object.
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
        -- What the marketing-preferences endpoints read, through the customer_preferences view.
        home_brand_id,
        anonymous_id,
        marketing_preferences,
        preference_state,
        anonymous_received_at,
        anonymous_event_id,
        created_file,
        created_channel,
        created_time,
        created_event_id,
        last_activity_time,
        group_call['group_id'] as group_id,
        group_call
    from traits_objects
    -- Sorted, on passes too: unsorted, a pass's new customers (often anonymous visitors) came
    -- out together and filled whole row groups with null user_ids (test ducklake_stats_complete).
    -- Not by user_id: anonymous customers' null user_ids would fill whole row groups, and
    -- DuckLake (1.5.5) then records no min/max for the file's user_id and prunes that file from
    -- every `where user_id = ...` once another file has stats (customers silently not found).
    order by account_id, customer_id
)

select * from final
