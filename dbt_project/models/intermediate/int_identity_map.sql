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

-- What the last pass stored (nothing on a full build), to tell whether the userId changed.
stored as (
    {% if is_incremental() -%}
    select
        account_id,
        anonymous_id,
        user_id,
        changed_at
    from {{ this }}
    {%- else -%}
    select
        null::varchar as account_id,
        null::varchar as anonymous_id,
        null::varchar as user_id,
        null::timestamptz as changed_at
    where false
    {%- endif %}
),

final as (
    select
        mapped.*,
        -- Changed by an unfinished pass and not since: still changed for this window.
        case
            when stored.user_id is null or mapped.user_id != stored.user_id
                then {{ pass_through() }}
            else stored.changed_at
        end as changed_at
    from mapped
    left join stored
        on mapped.account_id = stored.account_id and mapped.anonymous_id = stored.anonymous_id
)

select * from final
