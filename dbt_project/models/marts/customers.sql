-- One row per served customer (grain: customer_id): the traits object and the metadata object of
-- INTERFACE.md 2.9, with typed columns for lookups. A view: customer_profiles holds each
-- customer's row without the firstEvent/lastEvent members of `metadata`, and they are spliced in
-- here from customer_event_objects (a pass rewrites only the members it changes; see
-- customer_profiles). A lookup by customer_id reads one row group of each file of both tables;
-- the read API answers metadata requests from this view.
{{ config(materialized='view') }}

with objects as (
    select
        customer_id,
        {{ event_members('first') }} as first_event,
        {{ event_members('last') }} as last_event
    from {{ ref('customer_event_objects') }}
    group by customer_id
),

final as (
    select
        profiles.customer_id,
        profiles.client_id,
        profiles.account_id,
        profiles.user_id,
        profiles.email_lower,
        profiles.subscription_id,
        profiles.traits,
        -- Spliced in as text: a patch would parse and write the whole object again.
        (
            left(profiles.metadata_base::varchar, length(profiles.metadata_base::varchar) - 1)
            || ',"firstEvent":' || objects.first_event
            || ',"lastEvent":' || objects.last_event
            || '}'
        )::json as metadata,
        profiles.created_time,
        profiles.created_event_id,
        profiles.last_activity_time
    from {{ ref('customer_profiles') }} as profiles
    -- Inner: the filters of a lookup reach both tables' scans (every customer has events).
    inner join objects on profiles.customer_id = objects.customer_id
)

select * from final
