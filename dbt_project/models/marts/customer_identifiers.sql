-- One row per (served customer, identifier type, identifier): every userId, anonymousId and email
-- a served customer has been seen with, with first and last seen times. The mapping of
-- identifiers to customers (issue 5), and its own incremental state: a pass folds the rewritten
-- messages into each changed customer's stored rows (min and max), and rebuilds a customer that
-- lost messages from all of them. Until 2026-11-25 an intermediate model held the same rows for
-- every customer and this mart copied the served ones: at 10M messages (+100k), writing 341k
-- rows twice cost ~1.3 s of a pass. A customer that stops being served loses its rows here, as
-- in customer_profiles (which folds from its own rows too): one served again is to be rebuilt.
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

-- The served customers among those changed (customer_profiles applies regulation_state).
served as (
    select customer_id from {{ ref('customer_profiles') }}
    {{ where_customer_changed() }}
),

final as (
    select
        seen.customer_id,
        seen.account_id,
        seen.id_type,
        seen.id_value,
        min(seen.first_seen) as first_seen,
        max(seen.last_seen) as last_seen
    from seen
    semi join served on seen.customer_id = served.customer_id
    group by all
)

select * from final
