-- One row per group call (grain: account_id, message_id): the group it names, the customer it
-- belongs to (the caller, attributed as any message is) and its traits, which are the group's,
-- not the caller's. The groups and group_members marts are views over it, so a Delete of a
-- caller removes their calls and the traits those calls set (their rows carry customer_id).
-- Incrementally, the rows of the messages a pass rewrote are replaced (`pass_through`: the
-- pass that wrote them).
{{
    config(
        materialized='incremental',
        incremental_strategy='per_message',
        unique_key=['account_id', 'message_id'],
    )
}}

with messages as (
    select * from {{ ref('int_messages_identified') }}
    {{ where_rewritten() }}
),

final as (
    select
        account_id,
        message_id,
        event_id,
        group_id,
        customer_id,
        customer_user_id as user_id,
        case when json_type(traits) = 'OBJECT' then traits else '{}'::json end as traits,
        event_time,
        received_at,
        pass_through
    from messages
    where type = 'group' and group_id is not null
)

select * from final
