-- One row per deduplicated message, attributed to its customer: its userId, else the userId its
-- anonymousId was (ever, before or after) identified with, else the anonymous visitor itself.
-- Incrementally, a pass attributes the messages loaded since the last pass, and again the
-- anonymous messages of every anonymousId whose userId the pass changed (int_identity_map
-- `changed_at`: a first identify, or an earlier one, moves them). `previous_customer_id` keeps whom a rewritten message belonged
-- to at the last finished pass, so int_customers_changed can rebuild the customer it left;
-- `pass_through` is the window end of the pass that wrote the row.
{{
    config(
        materialized='incremental',
        incremental_strategy='per_message',
        restated_column='restated',
        unique_key=['account_id', 'message_id'],
    )
}}

with deduped as (
    select * from {{ ref('int_messages_deduped') }}
),

identity_map as (
    select * from {{ ref('int_identity_map') }}
),

{% if is_incremental() %}
loaded as (
    select * from deduped
    where {{ in_window('loaded_at') }}
),

-- Found on narrow columns first, then read whole behind a bitmap filter (see set_hash_bits):
-- a semi join straight onto the messages read every message's columns (3 s at 10M messages).
{%- set earlier_anonymous %}
    select earlier.event_id
    from {{ ref('int_messages_deduped') }} as earlier
    semi join (
        select
            account_id,
            anonymous_id
        from {{ ref('int_identity_map') }}
        where {{ in_window('changed_at') }}
    ) as paired
        on earlier.account_id = paired.account_id and earlier.anonymous_id = paired.anonymous_id
    where earlier.user_id is null and not ({{ in_window('earlier.loaded_at') }})
{%- endset %}
{{ set_hash_bits('mallard_reattributed_bits', earlier_anonymous) }}

messages as (
    select
        *,
        false as reattributed
    from loaded
    union all by name
    select
        *,
        true as reattributed
    from deduped
    where
        {{ hash_bits_filter('mallard_reattributed_bits', 'event_id') }}
        and event_id in ({{ earlier_anonymous }})
),

-- The stored rows of the messages this pass writes again: those it attributes again, the copies
-- its new ones replace, and the rows of a pass that died with this window. A new message has
-- none, so only those keys are looked up: joined on every key of the window, the stored rows'
-- keys were all read (10M at 10M messages), though none matched on most passes.
restated_keys as (
    select
        account_id,
        message_id
    from messages
    where reattributed or replaces_stored
),

stored as (
    select
        account_id,
        message_id,
        customer_id,
        previous_customer_id,
        pass_through
    from {{ this }}
    where {{ in_window('pass_through') }}
    union all
    select
        earlier.account_id,
        earlier.message_id,
        earlier.customer_id,
        earlier.previous_customer_id,
        earlier.pass_through
    from {{ this }} as earlier
    semi join restated_keys
        on
            earlier.account_id = restated_keys.account_id
            and earlier.message_id = restated_keys.message_id
    where not ({{ in_window('earlier.pass_through') }})
),
{% else %}
messages as (
    select
        *,
        false as reattributed
    from deduped
),
{% endif %}

resolved as (
    select
        messages.*,
        coalesce(messages.user_id, identity_map.user_id) as customer_user_id,
        case
            when coalesce(messages.user_id, identity_map.user_id) is not null
                then 'user:' || coalesce(messages.user_id, identity_map.user_id)
            else 'anon:' || messages.anonymous_id
        end as customer_key
    from messages
    -- Equality conditions only: an extra `messages.user_id is null` here turned the hash join
    -- into a nested loop (229 s for 1M messages); coalesce already prefers the message's userId.
    left join identity_map
        on
            messages.account_id = identity_map.account_id
            and messages.anonymous_id = identity_map.anonymous_id
),

attributed as (
    select
        *,
        {{ customer_id('account_id', 'customer_key') }} as customer_id
    from resolved
),

final as (
    select
        attributed.* exclude (attributed.reattributed),
        -- Rewritten twice before a pass finishes: keep the customer of the finished pass.
        {% if is_incremental() -%}
        case
            when {{ in_window('stored.pass_through') }} then stored.previous_customer_id
            else stored.customer_id
        end
        {%- else -%}
        cast(null as varchar)
        {%- endif %} as previous_customer_id,
        -- Stored before this pass (attributed again, a replaced copy, or written by a pass that
        -- died): only such a message can have rows here and in the models built from it, so
        -- only theirs are deleted (strategy per_message).
        {% if is_incremental() -%}
        stored.message_id is not null
        {%- else -%}
        false
        {%- endif %} as restated,
        {{ pass_through() }} as pass_through
    from attributed
    {% if is_incremental() -%}
    -- (sqlfluff lints each branch of the `if`s apart: in one, nothing reads `stored`.)
    left join stored  -- noqa: ST11
        on
            attributed.account_id = stored.account_id
            and attributed.message_id = stored.message_id
    {%- endif %}
)

select * from final
