-- One row per (identify message, top-level trait key): the history every trait value comes
-- from, so a profile can be read as of any time. Incrementally, the rows of the messages a pass
-- rewrote are replaced (`pass_through`: the pass that wrote them).
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

identifies as (
    select * from messages
    where type = 'identify' and json_type(traits) = 'OBJECT'
),

keys as (
    select
        customer_id,
        account_id,
        event_id,
        message_id,
        event_time,
        received_at,
        pass_through,
        traits,
        unnest(json_keys(traits)) as trait_key
    from identifies
),

final as (
    select
        customer_id,
        account_id,
        trait_key,
        traits -> ('$."' || replace(trait_key, '"', '\"') || '"') as trait_value,
        event_time,
        received_at,
        message_id,
        event_id,
        pass_through
    from keys
)

select * from final
