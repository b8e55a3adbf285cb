-- One row per audience file (grain: audience): whether its select ran in the last pass, the error
-- when it did not, and how many customers are in it now, all accounts together (the audiences
-- API counts per account from audience_members). A view: a pass builds nothing for it (passes
-- skip unchanged views), and its counts are those of the snapshot it is read at.
{{ config(materialized='view') }}

with matches as (
    select * from {{ ref('int_audience_matches') }}
),

members as (
    select * from {{ ref('audience_members') }}
),

current_counts as (
    select
        audience,
        count(*) as members
    from members
    where left_at is null
    group by audience
),

final as (
    select
        matches.audience,
        matches.file,
        case when matches.error is null then 'ok' else 'failed' end as status,
        matches.error,
        coalesce(current_counts.members, 0) as members
    from matches
    left join current_counts on matches.audience = current_counts.audience
    where matches.customer_id is null
)

select * from final
