-- One row per (account, anonymousId) that was ever seen with a userId: the first userId it was
-- identified with (by event time; ties by receipt, then messageId). Two userIds never merge.
-- Incrementally, the anonymousIds the window's messages pair with a userId are worked out again
-- over all history. `changed_at` is the window end of the pass that last changed the userId an
-- anonymousId belongs to: int_messages_identified attributes its anonymous messages again.
{{
    config(
        materialized='incremental',
        incremental_strategy='delete+insert',
        unique_key=['account_id', 'anonymous_id'],
    )
}}

with pairs as (
    select
        account_id,
        anonymous_id,
        user_id,
        event_time,
        received_at,
        message_id,
        loaded_at
    from {{ ref('int_messages_deduped') }}
    where anonymous_id is not null and user_id is not null
),

{% if is_incremental() %}
touched as (
    select distinct
        account_id,
        anonymous_id
    from pairs
    where {{ in_window('loaded_at') }}
),

candidates as (
    select pairs.*
    from pairs
    semi join touched
        on pairs.account_id = touched.account_id and pairs.anonymous_id = touched.anonymous_id
),
{% else %}
candidates as (
    select * from pairs
),
{% endif %}

mapped as (
    select
        account_id,
        anonymous_id,
        arg_min(user_id, (event_time, received_at, message_id)) as user_id,
        min(event_time) as identified_at
    from candidates
    group by account_id, anonymous_id
),

final as (
    select
        mapped.*,
        {% if is_incremental() -%}
        -- Changed by an unfinished pass and not since: still changed for this window.
        case
            when mapped.user_id is distinct from stored.user_id then {{ pass_through() }}
            else stored.changed_at
        end
        {%- else -%}
        {{ pass_through() }}
        {%- endif %} as changed_at
    from mapped
    {% if is_incremental() -%}
    left join {{ this }} as stored
        on mapped.account_id = stored.account_id and mapped.anonymous_id = stored.anonymous_id
    {%- endif %}
)

select * from final
