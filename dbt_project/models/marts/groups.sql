-- One row per group (grain: account_id, group_id): the traits group calls gave it, when it was
-- first and last named, and how many customers named it. Per top-level trait key the value with
-- the latest event time wins (ties: later receipt, then messageId), whatever order the calls
-- arrived in; objects and arrays are replaced whole: the rule of a customer's traits. A view over
-- the group calls (int_group_calls): a Delete of a caller takes the values their calls set, and
-- the group then shows what the other members' calls set (a group only they named is gone).
{{ config(materialized='view') }}

with calls as (
    select * from {{ ref('int_group_calls') }}
),

trait_rows as (
    select
        account_id,
        group_id,
        event_time,
        received_at,
        message_id,
        traits,
        unnest(json_keys(traits)) as trait_key
    from calls
),

latest as (
    select
        account_id,
        group_id,
        trait_key,
        arg_max(
            traits -> ('$."' || replace(trait_key, '"', '\"') || '"'), {{ event_order() }}
        ) as trait_value
    from trait_rows
    group by account_id, group_id, trait_key
),

objects as (
    select
        account_id,
        group_id,
        {{ json_object_agg('trait_key', 'trait_value') }} as traits
    from latest
    group by account_id, group_id
),

spans as (
    select
        account_id,
        group_id,
        min(event_time) as first_seen,
        max(event_time) as last_seen,
        count(distinct customer_id) as member_count
    from calls
    group by account_id, group_id
),

final as (
    select
        spans.account_id,
        spans.group_id,
        coalesce(objects.traits, '{}'::json) as traits,
        spans.first_seen,
        spans.last_seen,
        spans.member_count
    from spans
    left join objects
        on spans.account_id = objects.account_id and spans.group_id = objects.group_id
)

select * from final
