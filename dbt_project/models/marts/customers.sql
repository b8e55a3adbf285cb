-- One row per served customer (grain: customer_id): the traits object and the metadata object of
-- INTERFACE.md 2.9, with typed columns for lookups. A view: customer_profiles holds each
-- customer's traits and the columns of its metadata, assembled here, and the firstEvent/lastEvent
-- members of `metadata` are spliced in from customer_event_winners (a pass adds only the
-- candidates of the members it changes; see customer_event_objects). A lookup by customer_id
-- reads one row group of each file of both tables; the read API answers metadata requests from
-- this view.
{{ config(materialized='view') }}

with objects as (
    select
        customer_id,
        {{ event_members('first') }} as first_event,
        {{ event_members('last') }} as last_event
    from {{ ref('customer_event_winners') }}
    group by customer_id
),

-- The metadata object without its events: the traits patched with the customer's metadata.
profiles as (
    select
        *,
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
                'audiencesStatic', '[]'::json,
                'lastActivityTime', {{ iso_ts('last_activity_time') }}
            )
        ) as metadata_base
    from {{ ref('customer_profiles') }}
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
