-- One row per customer (grain: customer_id): the traits and metadata objects of the
-- profile API, with typed columns for lookups. A view: customer_profiles holds each
-- customer's traits and the columns of its metadata, assembled here, and the firstEvent/lastEvent
-- members of `metadata` are spliced in from the winners among the candidates in
-- customer_event_objects (a pass adds only candidates of the members it changes). A lookup by
-- customer_id reads one row group of each file of both tables; the read API answers metadata
-- requests from this view.
{{ config(materialized='view') }}

with candidates as (
    select
        customer_id,
        {{ event_candidates('first') }} as first_candidates,
        {{ event_candidates('last') }} as last_candidates
    from {{ ref('customer_event_objects') }}
    group by customer_id
),

-- The winner of each action among the candidates (macros/event_members.sql).
objects as (
    select
        customer_id,
        {{ event_members('first_candidates') }} as first_event,
        {{ event_members('last_candidates') }} as last_event
    from candidates
),

-- The audiences each customer is in now, by name (audience_members: rows not left).
audiences as (
    select
        customer_id,
        to_json(list(audience order by audience)) as audiences_static
    from {{ ref('audience_members') }}
    where left_at is null
    group by customer_id
),

-- The metadata object without its events: the traits patched with the customer's metadata.
profiles as (
    select
        customer_profiles.*,
        json_merge_patch(
            traits,
            json_object(
                -- Null: a trait of these names gives way to the objects spliced in below.
                'firstEvent', null,
                'lastEvent', null,
                '_subscriptionId', subscription_id,
                'createdBy', json_object(
                    'filename', created_file,
                    'createdTime', {{ iso_ts('created_time') }},
                    'type', created_channel
                ),
                'audiencesStatic', coalesce(audiences.audiences_static, '[]'::json),
                'groupId', customer_profiles.group_id,
                'lastActivityTime', {{ iso_ts('last_activity_time') }}
            )
        ) as metadata_base
    from {{ ref('customer_profiles') }} as customer_profiles
    left join audiences on customer_profiles.customer_id = audiences.customer_id
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
    from profiles
    -- Inner: the filters of a lookup reach both tables' scans (every customer has events).
    inner join objects on profiles.customer_id = objects.customer_id
)

select * from final
