-- One row per (profile as it stood, trait key, period): the value the key had in the profile's
-- traits object from `valid_from` until `valid_to` (exclusive; null: still), by event time. The
-- traits of a profile as of a time T are its rows with valid_from <= T < valid_to: the rules of
-- int_customer_traits applied to the messages with event time <= T, identity included. So a
-- visitor's messages are the visitor's own profile (`customer_id_then`) until the identify that
-- ties its anonymousId to a userId (int_identity_map `identified_at`), and the customer's from
-- then on; `name` and `campaign` are filled as the traits object fills them, and `id` and
-- `externalId` are the profile's own. `marketingPreferences` is not here: the preferences
-- endpoint changes it too (customer_preferences).
-- A per-customer model: each pass rebuilds the customers it changed (`customer_id`, whom the
-- messages belong to now) from all their messages, visitor periods included.
{{
    config(
        materialized='incremental',
        incremental_strategy='per_customer',
        unique_key='customer_id',
    )
}}

with messages as (
    select * from {{ pass_customer_messages() }}
),

identity_map as (
    select * from {{ ref('int_identity_map') }}
),

-- The trait rows of those messages: int_trait_history's customer is its message's.
trait_rows as (
    select * from {{ ref('int_trait_history') }}
    {% if is_incremental() -%}
    where customer_id in (select customer_id from {{ ref('int_customers_changed') }})
    {%- endif %}
),

-- Who held each message, from when: a visitor's message (no userId) from before its anonymousId
-- was identified is the visitor's until then and the customer's from then on; any other message
-- is its customer's from its event time. (Equality joins only: see int_messages_identified.)
spans as (
    select
        messages.customer_id,
        messages.account_id,
        messages.customer_id as customer_id_then,
        messages.customer_user_id as user_id_then,
        case when messages.customer_user_id is null then messages.anonymous_id end as anonymous_id,
        messages.message_id,
        messages.event_id,
        messages.event_time,
        messages.received_at,
        messages.context -> '$.campaign' as campaign,
        case
            when messages.user_id is null and identity_map.identified_at > messages.event_time
                then identity_map.identified_at
            else messages.event_time
        end as known_from,
        null::timestamptz as held_until
    from messages
    left join identity_map
        on
            messages.account_id = identity_map.account_id
            and messages.anonymous_id = identity_map.anonymous_id
    union all
    select
        messages.customer_id,
        messages.account_id,
        {{ customer_id('messages.account_id', "'anon:' || messages.anonymous_id") }}
        as customer_id_then,
        null as user_id_then,
        messages.anonymous_id,
        messages.message_id,
        messages.event_id,
        messages.event_time,
        messages.received_at,
        messages.context -> '$.campaign' as campaign,
        messages.event_time as known_from,
        identity_map.identified_at as held_until
    from messages
    inner join identity_map
        on
            messages.account_id = identity_map.account_id
            and messages.anonymous_id = identity_map.anonymous_id
    where messages.user_id is null and messages.event_time < identity_map.identified_at
),

keyed as (
    select
        spans.customer_id,
        spans.account_id,
        spans.customer_id_then,
        spans.known_from,
        trait_rows.trait_key,
        trait_rows.trait_value,
        trait_rows.event_time,
        trait_rows.received_at,
        trait_rows.message_id,
        trait_rows.event_id
    from spans
    inner join trait_rows
        on spans.account_id = trait_rows.account_id and spans.message_id = trait_rows.message_id
),

-- Per key, the winner among the values known at each point (latest event time, then receipt,
-- then messageId): the set of known messages only grows until the profile ends.
raw_steps as (
    select distinct
        customer_id_then,
        trait_key,
        known_from,
        arg_max(
            {
                'trait_value': trait_value,
                'message_id': message_id,
                'event_id': event_id,
                'event_time': event_time,
                'received_at': received_at
            },
            {{ event_order() }}
        ) over by_key as winner
    from keyed
    where trait_key not in ('id', 'externalId', 'marketingPreferences', 'name', 'campaign')
    window by_key as (
        partition by customer_id_then, trait_key
        order by known_from range between unbounded preceding and current row
    )
),

-- The keys the filled traits are made of, per message.
parts as (
    select
        account_id,
        message_id,
        bool_or(trait_key = 'name') as sets_name,
        bool_or(trait_key = 'campaign') as sets_campaign,
        bool_or(trait_key = 'firstName') as sets_first_name,
        bool_or(trait_key = 'lastName') as sets_last_name,
        any_value(trait_value) filter (where trait_key = 'name') as name,
        any_value(trait_value) filter (where trait_key = 'campaign') as campaign,
        any_value(trait_value ->> '$') filter (where trait_key = 'firstName') as first_name,
        any_value(trait_value ->> '$') filter (where trait_key = 'lastName') as last_name
    from trait_rows
    where trait_key in ('name', 'campaign', 'firstName', 'lastName')
    group by account_id, message_id
),

timeline as (
    select
        spans.*,
        coalesce(parts.sets_name, false) as sets_name,
        coalesce(parts.sets_campaign, false) as sets_campaign,
        coalesce(parts.sets_first_name, false) as sets_first_name,
        coalesce(parts.sets_last_name, false) as sets_last_name,
        parts.name as name_value,
        parts.campaign as campaign_value,
        parts.first_name,
        parts.last_name
    from spans
    left join parts on spans.account_id = parts.account_id and spans.message_id = parts.message_id
),

-- At each point of a profile: the winners of the keys the filled traits are made of, and its
-- first message by event time.
points as (
    select distinct
        customer_id,
        account_id,
        customer_id_then,
        user_id_then,
        anonymous_id,
        known_from,
        held_until,
        arg_max(
            {
                'trait_value': name_value,
                'message_id': message_id,
                'event_id': event_id,
                'event_time': event_time,
                'received_at': received_at
            },
            {{ event_order() }}
        ) filter (where sets_name) over by_time as name_winner,
        arg_max(
            {
                'trait_value': campaign_value,
                'message_id': message_id,
                'event_id': event_id,
                'event_time': event_time,
                'received_at': received_at
            },
            {{ event_order() }}
        ) filter (where sets_campaign) over by_time as campaign_winner,
        arg_max(first_name, {{ event_order() }}) filter (where sets_first_name) over by_time
        as first_name,
        arg_max(last_name, {{ event_order() }}) filter (where sets_last_name) over by_time
        as last_name,
        arg_min(
            {
                'trait_value': campaign,
                'message_id': message_id,
                'event_id': event_id,
                'event_time': event_time,
                'received_at': received_at
            },
            {{ event_order() }}
        ) over by_time as first_message
    from timeline
    window by_time as (
        partition by customer_id_then
        order by known_from range between unbounded preceding and current row
    )
),

-- The filled keys at each point: `name` from firstName/lastName when absent or null, `campaign`
-- from the first message's context unless an identify set it; `id` and `externalId`, the
-- profile's own (no message of their own), for as long as it stands.
filled_steps as (
    select
        points.customer_id_then,
        'name' as trait_key,
        points.known_from,
        case
            when
                (points.name_winner.trait_value ->> '$') is null
                and coalesce(points.first_name, points.last_name) is not null
                then {
                    'trait_value': to_json(concat_ws(' ', points.first_name, points.last_name)),
                    'message_id': null,
                    'event_id': null,
                    'event_time': null,
                    'received_at': null
                }
            else points.name_winner
        end as winner
    from points
    union all
    select
        customer_id_then,
        'campaign' as trait_key,
        known_from,
        case
            when campaign_winner is not null then campaign_winner
            when json_type(first_message.trait_value) = 'OBJECT' then first_message
        end as winner
    from points
    union all
    select
        customer_id_then,
        'id' as trait_key,
        known_from,
        {
            'trait_value': to_json(customer_id_then),
            'message_id': null,
            'event_id': null,
            'event_time': null,
            'received_at': null
        } as winner
    from points
    union all
    select
        customer_id_then,
        'externalId' as trait_key,
        known_from,
        {
            'trait_value': coalesce(to_json(user_id_then), 'null'::json),
            'message_id': null,
            'event_id': null,
            'event_time': null,
            'received_at': null
        } as winner
    from points
),

steps as (
    select * from raw_steps
    union all by name
    select * from filled_steps
),

profiles as (
    select distinct
        customer_id,
        account_id,
        customer_id_then,
        user_id_then,
        anonymous_id,
        held_until
    from points
),

-- A period starts where the winner changes; an absent winner (no `name` yet) is a gap.
changes as (
    select
        *,
        coalesce(winner.trait_value::varchar, '') || '|' || coalesce(winner.message_id, '')
        as change_key
    from steps
),

starts as (
    select * from changes
    window by_key as (partition by customer_id_then, trait_key order by known_from)
    qualify coalesce(lag(change_key) over by_key, '') != change_key
),

periods as (
    select
        *,
        lead(known_from) over (
            partition by customer_id_then, trait_key order by known_from
        ) as next_from
    from starts
),

final as (
    select
        profiles.customer_id,
        profiles.account_id,
        periods.customer_id_then,
        profiles.user_id_then,
        profiles.anonymous_id,
        periods.trait_key,
        periods.winner.trait_value,
        periods.known_from as valid_from,
        coalesce(periods.next_from, profiles.held_until) as valid_to,
        periods.winner.message_id,
        periods.winner.event_id,
        periods.winner.event_time,
        periods.winner.received_at
    from periods
    inner join profiles on periods.customer_id_then = profiles.customer_id_then
    where periods.winner.trait_value is not null
    order by profiles.account_id, periods.customer_id_then, periods.trait_key, valid_from
)

select * from final
