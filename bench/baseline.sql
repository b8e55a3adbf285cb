-- The pipeline benchmark's baseline: the derivations of the dbt models written by hand as one
-- DuckDB script over the landing Parquet, into a local DuckDB file. It produces the same two
-- served tables (`events`, `customers`, same columns and values as lake.marts.*) and nothing
-- else: no raw copy, no intermediate tables, no tests, no catalog, no orchestration. Marketing
-- preferences are not derived (the generated traffic has none: every customer gets the default
-- object), so the preference models are work Mallard does and this script does not.
-- Placeholders: __LANDING_GLOB__, __LANDING_ROOT__, __IPAD__, __OPAD__ (HMAC pads, hex).

create temp table identified as
with raw as (
    select
        *,
        replace(filename, '__LANDING_ROOT__', '') as landing_file,
        message::json as msg
    from read_parquet('__LANDING_GLOB__', filename = true, hive_partitioning = false)
),

deduped as (
    -- first received copy per (account, messageId) wins
    select * from raw
    qualify row_number() over (
        partition by account_id, message_id order by received_at, event_id
    ) = 1
),

identity_map as (
    -- an anonymousId belongs to the first userId it was seen with, by event time
    select
        account_id,
        anonymous_id,
        arg_min(user_id, ("timestamp", received_at, message_id)) as user_id
    from deduped
    where anonymous_id is not null and user_id is not null
    group by all
)

select
    d.event_id,
    d.message_id,
    d.client_id,
    d.account_id,
    d.brand_id,
    d.type,
    d.anonymous_id,
    d."timestamp" as event_time,
    d.received_at,
    d.channel,
    d.landing_file,
    case
        when d.type <> 'track' then d.type
        else regexp_replace(
            regexp_replace(
                lower(regexp_replace(
                    regexp_replace(d.event, '(\p{Lu})(\p{Lu}\p{Ll})', '\1_\2', 'g'),
                    '([\p{Ll}\p{N}])(\p{Lu})', '\1_\2', 'g')),
                '[^\p{L}\p{N}]+', '_', 'g'),
            '^_+|_+$', '', 'g')
    end as event_action,
    case
        when d.type = 'track' then d.event
        when d.type in ('screen', 'page') then coalesce(d.msg ->> '$.name', d.type)
        else d.type
    end as event_name,
    d.msg -> '$.traits' as traits,
    d.msg -> '$.context' as context,
    d.msg -> '$.properties' as properties,
    coalesce(d.user_id, m.user_id) as customer_user_id,
    md5(d.account_id || '|' || case
        when coalesce(d.user_id, m.user_id) is not null
            then 'user:' || coalesce(d.user_id, m.user_id)
        else 'anon:' || d.anonymous_id
    end) as customer_id
from deduped as d
-- The map only matters where userId is null (coalesce): keeping `d.user_id is null` out of the
-- join condition keeps this a hash join (with it DuckDB plans a nested-loop join).
left join identity_map as m
    on d.account_id = m.account_id and d.anonymous_id = m.anonymous_id;

create temp table traits as
with keyed as (
    select
        customer_id, event_time, received_at, message_id, traits,
        unnest(json_keys(traits)) as k
    from identified
    where type = 'identify' and json_type(traits) = 'OBJECT'
),

latest as (
    -- per top-level key, the latest event time wins (ties: later receipt, then messageId)
    select
        customer_id,
        k,
        arg_max(traits -> ('$."' || replace(k, '"', '\"') || '"'),
            (event_time, received_at, message_id)) as v
    from keyed
    group by all
),

parts as (
    select
        customer_id,
        bool_or(k = 'campaign') as has_campaign,
        max(v ->> '$') filter (where k = 'name') as name,
        max(v ->> '$') filter (where k = 'firstName') as first_name,
        max(v ->> '$') filter (where k = 'lastName') as last_name
    from latest
    group by all
),

first_campaign as (
    -- the context campaign of the customer's first message (none if that one had none)
    select
        customer_id,
        arg_min_null(context -> '$.campaign', (event_time, received_at, message_id)) as campaign
    from identified
    group by all
),

derived as (
    select f.customer_id, 'campaign' as k, f.campaign as v
    from first_campaign as f left join parts as p on f.customer_id = p.customer_id
    where json_type(f.campaign) = 'OBJECT' and not coalesce(p.has_campaign, false)
    union all
    select customer_id, 'name', to_json(concat_ws(' ', first_name, last_name))
    from parts
    where name is null and coalesce(first_name, last_name) is not null
),

grouped as (
    -- keys in sorted order, as the customers mart writes them
    select
        customer_id,
        ('{' || string_agg(to_json(k)::varchar || ':' || v::varchar, ',' order by k) || '}')::json
            as t
    from (
        select * from latest anti join derived using (customer_id, k)
        union all
        select * from derived
    )
    group by all
)

select f.customer_id, coalesce(g.t, '{}'::json) as traits
from first_campaign as f left join grouped as g on f.customer_id = g.customer_id;

create table events as
select
    i.event_id,
    i.customer_id,
    i.customer_user_id as user_id,
    t.traits ->> '$.email' as email,
    lower(t.traits ->> '$.email') as email_lower,
    i.event_action,
    i.event_time,
    i.received_at as received_time,
    i.client_id,
    i.account_id,
    i.brand_id,
    i.channel as source,
    json_object(
        'id', i.event_id,
        'customerId', i.customer_id,
        'userId', i.customer_user_id,
        'externalId', i.customer_user_id,
        'email', t.traits ->> '$.email',
        'eventId', i.event_id,
        'eventTime', strftime(i.event_time at time zone 'UTC', '%Y-%m-%dT%H:%M:%S.%gZ'),
        'receivedTime', strftime(i.received_at at time zone 'UTC', '%Y-%m-%dT%H:%M:%S.%gZ'),
        'eventAction', i.event_action,
        'clientId', i.client_id,
        'accountId', i.account_id,
        'brandId', i.brand_id,
        'source', i.channel,
        'rawData', json_object(
            'userId', i.customer_user_id,
            'anonymousId', i.anonymous_id,
            'action', i.type,
            'event', i.event_name,
            'context', json_object(
                'ip', i.context ->> '$.ip',
                'user_agent', i.context ->> '$.userAgent',
                'traits', coalesce(
                    case when i.type = 'identify' then i.traits end, i.context -> '$.traits'
                )
            ),
            'properties', coalesce(i.properties, '{}'::json),
            'timestamp', strftime(i.event_time at time zone 'UTC', '%Y-%m-%dT%H:%M:%S.%gZ'),
            'sendType', i.properties ->> '$.sendType'
        )
    ) as record
from identified as i
left join traits as t on i.customer_id = t.customer_id;

-- @customers: run once per chunk of customers (bench/baseline.py), reading the views
-- identified_chunk and traits_chunk: the per-customer JSON aggregates cannot spill to disk and
-- ran out of memory at 10M messages in one statement (as in the customers model).
insert into customers
with base as (
    select
        customer_id,
        account_id,
        any_value(client_id) as client_id,
        max(customer_user_id) as user_id,
        arg_min(landing_file, (received_at, event_id)) as created_file,
        arg_min(channel, (received_at, event_id)) as created_channel,
        min(received_at) as created_time,
        max(event_time) as last_activity_time
    from identified_chunk
    group by all
),

first_last_ids as (
    -- winners on narrow columns first; objects for every message ran out of memory at 10M
    select
        customer_id,
        event_action,
        arg_min(event_id, (event_time, received_at, event_id)) as first_id,
        arg_max(event_id, (event_time, received_at, event_id)) as last_id
    from identified_chunk
    group by all
),

objects as (
    select
        event_id,
        json_object(
            'eventId', event_id,
            'receivedTime', strftime(received_at at time zone 'UTC', '%Y-%m-%dT%H:%M:%S.%gZ'),
            'context', context,
            'sendType', properties ->> '$.sendType',
            'eventTime', strftime(event_time at time zone 'UTC', '%Y-%m-%dT%H:%M:%S.%gZ'),
            'action', type,
            'event', event_name,
            'userId', customer_user_id,
            'properties', properties,
            'timestamp', strftime(event_time at time zone 'UTC', '%Y-%m-%dT%H:%M:%S.%gZ')
        ) as o
    from identified_chunk
    where event_id in (select first_id from first_last_ids union select last_id from first_last_ids)
),

first_last as (
    select
        f.customer_id,
        json_group_object(f.event_action, fo.o) as first_event,
        json_group_object(f.event_action, lo.o) as last_event
    from first_last_ids as f
    inner join objects as fo on f.first_id = fo.event_id
    inner join objects as lo on f.last_id = lo.event_id
    group by all
),

assembled as (
    select
        b.*,
        sha256(unhex('__OPAD__') || unhex(sha256(unhex('__IPAD__') || b.customer_id::blob)))
            as subscription_id,
        json_merge_patch(
            t.traits,
            json_object(
                'id', b.customer_id,
                'externalId', b.user_id,
                -- the generated traffic sets no preferences: every customer has the defaults
                'marketingPreferences',
                '{"channels":[],"categories":[],"unsubscribeAll":false}'::json
            )
        ) as patched_traits,
        fl.first_event,
        fl.last_event
    from base as b
    inner join traits_chunk as t on b.customer_id = t.customer_id
    inner join first_last as fl on b.customer_id = fl.customer_id
),

with_external_id as (
    -- anonymous customers show "externalId": null, which a merge patch would drop
    select
        *,
        case
            when user_id is null
                then ('{"externalId":null,' || substr(patched_traits::varchar, 2))::json
            else patched_traits
        end as traits_object
    from assembled
)

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
                'createdTime', strftime(created_time at time zone 'UTC', '%Y-%m-%dT%H:%M:%S.%gZ'),
                'type', created_channel
            ),
            'firstEvent', first_event,
            'lastEvent', last_event,
            'audiencesStatic', '[]'::json,
            'lastActivityTime',
            strftime(last_activity_time at time zone 'UTC', '%Y-%m-%dT%H:%M:%S.%gZ')
        )
    ) as metadata,
    created_time,
    last_activity_time
from with_external_id
order by account_id, user_id, customer_id;
