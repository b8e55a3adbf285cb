-- One row per stay of a customer in an audience (grain: audience, customer_id, entered_at): when
-- a pass first found the customer in the audience's select, and when a later pass no longer did.
-- A customer who leaves and matches again gets a new row. The times are the opening times of
-- the passes (state.pass_manifest `opened_at`) that saw the change.
-- Membership history cannot be rebuilt from the messages (a select's past answers are not
-- kept), so the table is never built whole (`full_refresh=false`, also when the models' epoch
-- changes): each pass compares the audiences' current members with the open rows and writes
-- only the changes (stays closed, stays opened), so a pass that changes few members writes few
-- rows. An audience whose file failed this pass keeps its open rows as they are; an audience
-- whose file is gone closes them. A member is a customer of customer_profiles when it enters,
-- with that customer's tenancy columns. The rows a pass replaces are the open stays it closes,
-- so its delete reads no closed history (incremental_predicates).
{{
    config(
        materialized='incremental',
        incremental_strategy='delete+insert',
        unique_key=['audience', 'customer_id', 'entered_at'],
        incremental_predicates=['DBT_INCREMENTAL_TARGET.left_at is null'],
        full_refresh=false,
    )
}}

with matches as (
    select * from {{ ref('int_audience_matches') }}
),

profiles as (
    select * from {{ ref('customer_profiles') }}
),

manifest as (
    select * from {{ ref('stg_pass_manifest') }}
),

pass_window as (
    select * from {{ ref('int_pass_window') }}
),

-- The pass being built; a plain `dbt build` on a lake without passes takes the build's time.
pass_time as (
    select coalesce(max(manifest.opened_at), now()) as at
    from pass_window
    left join manifest on pass_window.pass_id = manifest.pass_id
),

current_members as (
    select
        audience,
        customer_id
    from matches
    where customer_id is not null
),

{% if is_incremental() %}
failed as (
    select audience from matches
    where customer_id is null and error is not null
),

open_stays as (
    select * from {{ this }}
    where left_at is null
),

left_now as (
    select
        open_stays.audience,
        open_stays.customer_id,
        open_stays.client_id,
        open_stays.account_id,
        open_stays.user_id,
        open_stays.entered_at,
        pass_time.at as left_at
    from open_stays
    cross join pass_time
    anti join current_members
        on
            open_stays.audience = current_members.audience
            and open_stays.customer_id = current_members.customer_id
    where open_stays.audience not in (select failed.audience from failed)
),

entered as (
    select
        current_members.audience,
        profiles.customer_id,
        profiles.client_id,
        profiles.account_id,
        profiles.user_id,
        pass_time.at as entered_at,
        cast(null as timestamptz) as left_at
    from current_members
    -- A member is a customer, with the customer's own tenancy columns.
    inner join profiles on current_members.customer_id = profiles.customer_id
    cross join pass_time
    anti join open_stays
        on
            current_members.audience = open_stays.audience
            and current_members.customer_id = open_stays.customer_id
),

final as (
    select * from left_now
    union all by name
    select * from entered
)
{% else %}
final as (
    select
        current_members.audience,
        profiles.customer_id,
        profiles.client_id,
        profiles.account_id,
        profiles.user_id,
        pass_time.at as entered_at,
        cast(null as timestamptz) as left_at
    from current_members
    inner join profiles on current_members.customer_id = profiles.customer_id
    cross join pass_time
)
{% endif %}

-- Sorted by customer: the files a pass writes keep a customer's rows in one row group, so the
-- customers view's lookup of one customer reads little of this table.
select * from final
order by customer_id, audience
