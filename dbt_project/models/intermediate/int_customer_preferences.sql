-- One row per customer: the marketing preferences the changes in int_preference_changes leave.
-- Per key (a channel, a category, unsubscribe-all) the change with the latest event time wins
-- (ties: later receipt, then messageId), whether it came by the preferences endpoint or by an
-- identify trait. Only keys ever set appear: defaults (channels opt-in, categories opt-out)
-- are applied against the brand's configured choices where those are known (the API).
-- Incremental passes fold the rewritten messages into the stored home brand and first anonymousId
-- (with the keys they won by); the changes, few, are read whole per changed customer.
{{
    config(
        materialized='incremental',
        incremental_strategy='replace_customers',
        on_schema_change='append_new_columns',
        unique_key='customer_id',
    )
}}

with messages as (
    {{ merge_input(ref('int_messages_identified'), [
        "customer_id",
        "account_id",
        "brand_id",
        "anonymous_id",
        "received_at",
        "event_id",
    ]) }}
),

changes as (
    select * from {{ ref('int_preference_changes') }}
    {{ where_customer_changed() }}
),

-- The winners' keys as plain columns: DuckLake (1.5.5) could not read back a struct holding a
-- timestamp from rows a small pass inlined into its catalog ("invalid timestamp field format").
firsts as (
    select
        customer_id,
        account_id,
        -- The brand a customer was first seen in: whose writeKey and choices its page shows.
        arg_min(brand_id, (received_at, event_id)) as home_brand_id,
        min(received_at) as home_received_at,
        arg_min(event_id, (received_at, event_id)) as home_event_id,
        arg_min(anonymous_id, (received_at, event_id)) filter (
            where anonymous_id is not null
        ) as anonymous_id,
        min(received_at) filter (where anonymous_id is not null) as anonymous_received_at,
        arg_min(event_id, (received_at, event_id)) filter (
            where anonymous_id is not null
        ) as anonymous_event_id
    from messages
    group by customer_id, account_id
    {{ union_stored_state([
        "customer_id",
        "account_id",
        "home_brand_id",
        "home_received_at",
        "home_event_id",
        "anonymous_id",
        "anonymous_received_at",
        "anonymous_event_id",
    ]) }}
),

customers as (
    select
        customer_id,
        account_id,
        arg_min(home_brand_id, (home_received_at, home_event_id)) as home_brand_id,
        min(home_received_at) as home_received_at,
        arg_min(home_event_id, (home_received_at, home_event_id)) as home_event_id,
        arg_min(anonymous_id, (anonymous_received_at, anonymous_event_id)) filter (
            where anonymous_id is not null
        ) as anonymous_id,
        min(anonymous_received_at) as anonymous_received_at,
        arg_min(anonymous_event_id, (anonymous_received_at, anonymous_event_id)) filter (
            where anonymous_id is not null
        ) as anonymous_event_id
    from firsts
    group by customer_id, account_id
),

latest as (
    -- (event time, receipt, messageId) is unique per customer and key: one winner each.
    select
        customer_id,
        pref_kind,
        pref_key,
        arg_max(pref_value, (event_time, received_at, message_id)) as pref_value,
        max(event_time) as event_time,
        arg_max(received_at, (event_time, received_at, message_id)) as received_at,
        arg_max(message_id, (event_time, received_at, message_id)) as message_id
    from changes
    group by customer_id, pref_kind, pref_key
),

per_customer as (
    select
        customer_id,
        coalesce(
            to_json(list(
                json_object('channel', pref_key, 'subscribed', pref_value) order by pref_key
            ) filter (where pref_kind = 'channel')),
            '[]'::json
        ) as channels,
        coalesce(
            to_json(list(
                json_object('category', pref_key, 'subscribed', pref_value) order by pref_key
            ) filter (where pref_kind = 'category')),
            '[]'::json
        ) as categories,
        bool_or(pref_value) filter (where pref_kind = 'unsubscribe_all') as unsubscribe_all,
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
        )) as state
    from latest
    group by customer_id
),

final as (
    select
        customers.customer_id,
        customers.account_id,
        customers.home_brand_id,
        customers.home_received_at,
        customers.home_event_id,
        customers.anonymous_id,
        customers.anonymous_received_at,
        customers.anonymous_event_id,
        json_object(
            'channels', coalesce(per_customer.channels, '[]'::json),
            'categories', coalesce(per_customer.categories, '[]'::json),
            'unsubscribeAll', coalesce(per_customer.unsubscribe_all, false)
        ) as marketing_preferences,
        coalesce(per_customer.state, '[]'::json) as state,
        {{ written_by_pass() }}
    from customers
    left join per_customer on customers.customer_id = per_customer.customer_id
)

select * from final
