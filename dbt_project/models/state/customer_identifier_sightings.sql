-- The sightings behind customer_identifiers (a view): per pass and (customer, identifier
-- type, identifier) its messages show, the first and last time among them. A pass appends the
-- sightings of the messages it rewrote, without reading or deleting the stored ones: the view
-- takes the min and max over them (fold rule identifier_spans), and compaction merges each
-- identifier's rows into one by the same rule (`meta.fold`). A message written again only adds a
-- sighting the min and max already hold. A customer rebuilt loses its rows, and gets them again
-- from all its messages. (One row per identifier would make every pass read, delete and write
-- again ~500k rows at 10M messages.) It holds the customers customer_profiles holds.
{{
    config(
        materialized='incremental',
        incremental_strategy='per_customer',
        appends_candidates=true,
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

-- The customers among those changed that customer_profiles holds.
served as (
    select customer_id from {{ ref('customer_profiles') }}
    {{ where_customer_changed() }}
),

final as (
    select
        identifiers.customer_id,
        identifiers.account_id,
        identifiers.id_type,
        identifiers.id_value,
        min(identifiers.event_time) as first_seen,
        max(identifiers.event_time) as last_seen
    from identifiers
    semi join served on identifiers.customer_id = served.customer_id
    group by all
)

select * from final
