-- One row per customer: the current traits object. Per top-level key the value with the latest
-- event time wins (ties: later receipt, then messageId), whatever order messages arrived in;
-- objects and arrays are replaced whole. `name` is filled from firstName/lastName when absent;
-- `campaign` comes from the context of the customer's first message (as a visitor or known)
-- when no identify sets it.
with history as (
    select * from {{ ref('int_trait_history') }}
),

messages as (
    select * from {{ ref('int_messages_identified') }}
),

latest as (
    select
        customer_id,
        trait_key,
        arg_max(trait_value, (event_time, received_at, message_id)) as trait_value
    from history
    group by customer_id, trait_key
),

explicit as (
    select
        customer_id,
        json_group_object(trait_key, trait_value) as traits
    from latest
    group by customer_id
),

first_campaign as (
    select
        customer_id,
        arg_min(context -> '$.campaign', (event_time, received_at, message_id)) as campaign
    from messages
    group by customer_id
),

derived as (
    select
        first_campaign.customer_id,
        'campaign' as trait_key,
        first_campaign.campaign as trait_value
    from first_campaign
    left join explicit on first_campaign.customer_id = explicit.customer_id
    where
        json_type(first_campaign.campaign) = 'OBJECT'
        and (explicit.traits is null or not json_exists(explicit.traits, '$.campaign'))
    union all
    select
        customer_id,
        'name' as trait_key,
        to_json(concat_ws(' ', traits ->> '$.firstName', traits ->> '$.lastName')) as trait_value
    from explicit
    where
        json_extract_string(traits, '$.name') is null
        and coalesce(
            json_extract_string(traits, '$.firstName'), json_extract_string(traits, '$.lastName')
        ) is not null
),

all_traits as (
    select
        customer_id,
        trait_key,
        trait_value
    from latest
    union all
    select
        customer_id,
        trait_key,
        trait_value
    from derived
),

grouped as (
    select
        customer_id,
        json_group_object(trait_key, trait_value) as traits
    from all_traits
    group by customer_id
),

final as (
    select
        first_campaign.customer_id,
        coalesce(grouped.traits, '{}'::json) as traits
    from first_campaign
    left join grouped on first_campaign.customer_id = grouped.customer_id
)

select * from final
