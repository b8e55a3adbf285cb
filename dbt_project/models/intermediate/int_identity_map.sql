-- One row per (account, anonymousId) that was ever seen with a userId, or named as the
-- previousId of an alias: the first userId it was identified with (by event time; ties by
-- receipt, then messageId). An alias(userId, previousId) pairs them as an identify pairs
-- anonymousId and userId, unless the previousId is itself the userId of some message of the
-- account (an identified user): two userIds never merge, and such a previousId keeps a row whose
-- user_id is null (it links nothing; the row is how a pass replaces a link the userId undoes).
-- Incrementally, a pass folds the window's pairs into the stored winner of each anonymousId they
-- touch (the winner's keys are kept: `identified_at`, `identified_received_at`,
-- `identified_message_id`). An anonymousId one of whose window messages replaced a stored copy
-- (`replaces_stored`: the stored winner may be the copy it replaced), or that the window shows as
-- a userId (an alias may have won it), is worked out again over all its history; the others are
-- not (working out every touched anonymousId again scans every stored message's pair columns,
-- ~0.4 s of a +100k pass at 10M). `changed_at` is the window end of the pass that last changed
-- the userId an anonymousId belongs to: int_messages_identified attributes its anonymous
-- messages again.
{{
    config(
        materialized='incremental',
        incremental_strategy='delete+insert',
        unique_key=['account_id', 'anonymous_id'],
    )
}}

-- The pass's window (macro pass_window()): built before the first model that reads it.
-- depends_on: {{ ref('int_pass_window') }}

-- Not one CTE of every pair read twice below: DuckDB materializes such a CTE, and then reads every
-- stored message's pair (1.8M rows at 10M messages, 0.75 s of CPU) whatever filters follow.
{%- set pairs %}
    select
        account_id,
        anonymous_id,
        user_id,
        event_time,
        received_at,
        message_id,
        loaded_at,
        replaces_stored,
        false as by_alias
    from {{ ref('int_messages_deduped') }}
    where anonymous_id is not null and user_id is not null
    union all
    select
        account_id,
        previous_id as anonymous_id,
        user_id,
        event_time,
        received_at,
        message_id,
        loaded_at,
        replaces_stored,
        true as by_alias
    from {{ ref('int_messages_deduped') }}
    where previous_id is not null and user_id is not null
{%- endset %}

{% if is_incremental() %}
with window_pairs as (
    select * from ({{ pairs }}) as pairs
    where {{ in_window('loaded_at') }}
),

window_users as (
    select
        account_id,
        user_id
    from {{ ref('int_messages_deduped') }}
    where {{ in_window('loaded_at') }} and user_id is not null
),

-- Stored anonymousIds the window shows as userIds: an alias that won one no longer counts.
shown_as_users as (
    select
        stored.account_id,
        stored.anonymous_id
    from {{ this }} as stored
    semi join window_users
        on
            stored.account_id = window_users.account_id
            and stored.anonymous_id = window_users.user_id
),

touched_keys as (
    select
        account_id,
        anonymous_id,
        replaces_stored as redo
    from window_pairs
    union all
    select
        account_id,
        anonymous_id,
        true as redo
    from shown_as_users
),

touched as (
    select
        account_id,
        anonymous_id,
        bool_or(redo) as redo
    from touched_keys
    group by account_id, anonymous_id
),

redone as (
    select * from touched
    where redo
),

-- What the last pass stored for the anonymousIds the window touches.
stored as (
    select
        stored.account_id,
        stored.anonymous_id,
        stored.user_id,
        stored.identified_at,
        stored.identified_received_at,
        stored.identified_message_id,
        stored.changed_at,
        touched.redo
    from {{ this }} as stored
    inner join touched
        on stored.account_id = touched.account_id and stored.anonymous_id = touched.anonymous_id
),

candidates as (
    select
        account_id,
        anonymous_id,
        user_id,
        event_time,
        received_at,
        message_id,
        by_alias
    from window_pairs
    union all
    -- A stored winner counts as it did: had its id since turned up as a userId, it is redone.
    select
        account_id,
        anonymous_id,
        user_id,
        identified_at as event_time,
        identified_received_at as received_at,
        identified_message_id as message_id,
        false as by_alias
    from stored
    where not redo and user_id is not null
    union all
    -- Empty on almost every pass: DuckDB then does not scan the stored pairs at all.
    select
        pairs.account_id,
        pairs.anonymous_id,
        pairs.user_id,
        pairs.event_time,
        pairs.received_at,
        pairs.message_id,
        pairs.by_alias
    from ({{ pairs }}) as pairs
    semi join redone
        on pairs.account_id = redone.account_id and pairs.anonymous_id = redone.anonymous_id
    where not ({{ in_window('pairs.loaded_at') }})
),
{% else %}
with candidates as (
    {{ pairs }}
),
{% endif %}

-- The previousIds of the aliases among the candidates, and those of them that are some message's
-- userId over all history (no alias on almost every pass: DuckDB then does not scan the
-- messages' userIds).
aliased as (
    select distinct
        account_id,
        anonymous_id
    from candidates
    where by_alias
),

identified as (
    select distinct
        users.account_id,
        users.user_id
    from {{ ref('int_messages_deduped') }} as users
    semi join aliased
        on users.account_id = aliased.account_id and users.user_id = aliased.anonymous_id
),

counted as (
    select
        candidates.*,
        (not candidates.by_alias or identified.user_id is null) as counts
    from candidates
    left join identified
        on
            candidates.account_id = identified.account_id
            and candidates.anonymous_id = identified.user_id
),

mapped as (
    select
        account_id,
        anonymous_id,
        arg_min(user_id, {{ event_order() }}) filter (where counts) as user_id,
        min(event_time) filter (where counts) as identified_at,
        arg_min(received_at, {{ event_order() }}) filter (where counts) as identified_received_at,
        arg_min(message_id, {{ event_order() }}) filter (where counts) as identified_message_id
    from counted
    group by account_id, anonymous_id
),

final as (
    select
        mapped.*,
        -- Changed by an unfinished pass and not since: still changed for this window.
        {% if is_incremental() -%}
        case
            when
                stored.anonymous_id is null
                or (mapped.user_id is null) != (stored.user_id is null)
                or mapped.user_id != stored.user_id
                then {{ pass_through() }}
            else stored.changed_at
        end
        {%- else -%}
        {{ pass_through() }}
        {%- endif %} as changed_at
    from mapped
    {% if is_incremental() -%}
    left join stored
        on mapped.account_id = stored.account_id and mapped.anonymous_id = stored.anonymous_id
    {%- endif %}
)

select * from final
