-- One row per (customer, identifier): every userId, anonymousId and email a customer has been
-- seen with, with first and last seen times. Incremental passes fold the rewritten messages into
-- the stored rows (min and max).
{{
    config(
        materialized='incremental',
        incremental_strategy='replace_customers',
        on_schema_change='append_new_columns',
        unique_key='customer_id',
    )
}}

-- Only the columns used: the CTE is read three times, so DuckDB materializes it.
with messages as (
    {{ merge_input(ref('int_messages_identified'), [
        "customer_id",
        "account_id",
        "customer_user_id",
        "anonymous_id",
        "event_time",
        "type",
        "traits",
    ]) }}
),

identifiers as (
    select
        customer_id,
        account_id,
        'userId' as id_type,
        customer_user_id as id_value,
        event_time
    from messages
    where customer_user_id is not null
    union all
    select
        customer_id,
        account_id,
        'anonymousId' as id_type,
        anonymous_id as id_value,
        event_time
    from messages
    where anonymous_id is not null
    union all
    select
        customer_id,
        account_id,
        'email' as id_type,
        json_extract_string(traits, '$.email') as id_value,
        event_time
    from messages
    where type = 'identify' and json_extract_string(traits, '$.email') is not null
),

seen as (
    select
        customer_id,
        account_id,
        id_type,
        id_value,
        event_time as first_seen,
        event_time as last_seen
    from identifiers
    {{ union_stored_state([
        "customer_id",
        "account_id",
        "id_type",
        "id_value",
        "first_seen",
        "last_seen",
    ]) }}
),

final as (
    select
        customer_id,
        account_id,
        id_type,
        id_value,
        min(first_seen) as first_seen,
        max(last_seen) as last_seen,
        {{ written_by_pass() }}
    from seen
    group by all
)

select * from final
