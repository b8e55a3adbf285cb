-- One row per customer: the current traits object. Per top-level key the value
-- with the latest event time wins (ties: later receipt, then messageId), whatever order messages
-- arrived in; objects and arrays are replaced whole. `name` is filled from firstName/lastName when
-- absent or null. `campaign` is the context campaign of the customer's first message by event
-- time (first recognition, as a visitor or known; a visitor's messages belong to the customer it
-- became), unless an identify sets `campaign` itself.
-- The state a pass folds its messages into is kept beside the answer: `latest`, each key's
-- winning value with the keys it won by, and the first message's keys. A pass compares only the
-- trait rows of the messages it rewrote against those winners, never the customer's history.
-- The winners are a column of the customer's row, not a table of their own (one row per
-- customer and key, 5.6M rows at 10M messages, which every pass would read and rewrite in part).
-- `email_changed_at` is the window end of the pass that last changed the email of a stored
-- customer (events carry it; a new customer's events are all the pass's own, replaced anyway).
{{
    config(
        materialized='incremental',
        incremental_strategy='per_customer',
        on_schema_change='append_new_columns',
        unique_key='customer_id',
    )
}}

-- What the last pass stored for the customers this pass changes (nothing on a full build), read
-- once: the winners and first message it folds into, and the email it tells a change of by.
with stored as (
    {% if merging() -%}
    select
        customer_id,
        latest,
        first_event_time,
        first_received_at,
        first_message_id,
        first_campaign,
        email,
        email_changed_at
    from {{ this }}
    {{ where_customer_changed() }}
    {%- else -%}
    select
        null::varchar as customer_id,
        null::varchar as email,
        null::timestamptz as email_changed_at
    where false
    {%- endif %}
),

{% if merging() -%}
-- The stored state the pass folds into: not that of the customers it rebuilds from all their
-- messages (int_customers_changed.rebuild). (sqlfluff lints each branch of the `if`s apart.)
folded as (  -- noqa: ST03
    select stored.* from stored
    anti join {{ ref('int_customers_changed') }} as changed
        on stored.customer_id = changed.customer_id and changed.rebuild
),
{%- endif %}

-- The trait rows a pass folds in (those of the messages it rewrote; all of a rebuilt customer's),
-- and the stored winners of the customers it folds into.
candidates as (
    {{ merge_input(ref('int_trait_history'), [
        "customer_id",
        "trait_key",
        "trait_value",
        "event_time",
        "received_at",
        "message_id",
    ]) }}
    {% if merging() -%}
    union all
    select
        customer_id,
        trait_key,
        trait_value,
        event_time,
        received_at,
        message_id
    from (
        select
            customer_id,
            -- A column per field of the winners' struct.
            unnest(latest, recursive := true)  -- noqa: AL03
        from folded
    ) as stored_winners
    {%- endif %}
),

latest as (
    select
        customer_id,
        trait_key,
        arg_max(trait_value, {{ event_order() }}) as trait_value,
        max(event_time) as event_time,
        arg_max(received_at, {{ event_order() }}) as received_at,
        arg_max(message_id, {{ event_order() }}) as message_id
    from candidates
    group by customer_id, trait_key
),

winners as (
    select
        customer_id,
        list({
            'trait_key': trait_key,
            'trait_value': trait_value,
            'event_time': event_time,
            'received_at': received_at,
            'message_id': message_id
        }) as latest
    from latest
    group by customer_id
),

messages as (
    {{ merge_input(ref('int_messages_identified'), [
        "customer_id",
        "event_time",
        "received_at",
        "message_id",
        "context -> '$.campaign' as campaign",
    ]) }}
    {% if merging() -%}
    union all
    select
        customer_id,
        first_event_time as event_time,
        first_received_at as received_at,
        first_message_id as message_id,
        first_campaign as campaign
    from folded
    {%- endif %}
),

name_parts as (
    select
        customer_id,
        bool_or(trait_key = 'campaign') as has_campaign,
        max(trait_value ->> '$') filter (where trait_key = 'name') as name,
        max(trait_value ->> '$') filter (where trait_key = 'firstName') as first_name,
        max(trait_value ->> '$') filter (where trait_key = 'lastName') as last_name
    from latest
    group by customer_id
),

-- arg_min_null: a first message without a campaign means no campaign, not a later one's.
first_recognition as (
    select
        customer_id,
        arg_min_null(campaign, {{ event_order() }}) as campaign,
        min(event_time) as first_event_time,
        arg_min(received_at, {{ event_order() }}) as first_received_at,
        arg_min(message_id, {{ event_order() }}) as first_message_id
    from messages
    group by customer_id
),

derived as (
    select
        first_recognition.customer_id,
        'campaign' as trait_key,
        first_recognition.campaign as trait_value
    from first_recognition
    left join name_parts on first_recognition.customer_id = name_parts.customer_id
    where
        json_type(first_recognition.campaign) = 'OBJECT'
        and not coalesce(name_parts.has_campaign, false)
    union all
    select
        customer_id,
        'name' as trait_key,
        to_json(concat_ws(' ', first_name, last_name)) as trait_value
    from name_parts
    where name is null and coalesce(first_name, last_name) is not null
),

all_traits as (
    select
        latest.customer_id,
        latest.trait_key,
        latest.trait_value
    from latest
    anti join derived
        on latest.customer_id = derived.customer_id and latest.trait_key = derived.trait_key
    union all
    select
        customer_id,
        trait_key,
        trait_value
    from derived
),

objects as (
    select
        customer_id,
        {{ json_object_agg('trait_key', 'trait_value') }} as traits
    from all_traits
    group by customer_id
),

built as (
    select
        first_recognition.customer_id,
        coalesce(objects.traits, '{}'::json) as traits,
        first_recognition.first_event_time,
        first_recognition.first_received_at,
        first_recognition.first_message_id,
        first_recognition.campaign as first_campaign,
        winners.latest
    from first_recognition
    left join objects on first_recognition.customer_id = objects.customer_id
    left join winners on first_recognition.customer_id = winners.customer_id
),

final as (
    select
        built.*,
        built.traits ->> '$.email' as email,
        -- Changed by an unfinished pass and not since: still changed for this window. A new
        -- customer's first email is no change. Counted as one, at 10M (+100k) 2,551 customers
        -- had 90 events outside the window, and their bitmap let ~5,900 other messages through:
        -- the events mart decoded every page of int_messages_identified (4.3 s of CPU).
        -- (Not `is distinct from`: sqlfluff's DuckDB dialect cannot parse it.)
        case
            when
                stored.customer_id is not null
                and (
                    ((built.traits ->> '$.email') is null) != (stored.email is null)
                    or (built.traits ->> '$.email') != stored.email
                )
                then {{ pass_through() }}
            else stored.email_changed_at
        end as email_changed_at,
        {{ written_by_pass() }}
    from built
    left join stored on built.customer_id = stored.customer_id
)

select * from final
