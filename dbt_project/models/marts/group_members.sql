-- One row per (group, customer) (grain: account_id, group_id, customer_id): a customer belongs
-- to every group one of its group calls names, from its first such call to its last (event
-- time). `is_current`: the group of the customer's latest group call (event time, ties: later
-- receipt, then messageId), which its profile metadata shows as `groupId`. A view over the group
-- calls (int_group_calls).
{{ config(materialized='view') }}

with calls as (
    select * from {{ ref('int_group_calls') }}
),

current_groups as (
    select
        customer_id,
        arg_max(group_id, {{ event_order() }}) as group_id
    from calls
    group by customer_id
),

final as (
    select
        calls.account_id,
        calls.group_id,
        calls.customer_id,
        any_value(calls.user_id) as user_id,
        min(calls.event_time) as first_seen,
        max(calls.event_time) as last_seen,
        count(*) as call_count,
        bool_or(current_groups.group_id is not null) as is_current
    from calls
    left join current_groups
        on calls.customer_id = current_groups.customer_id and calls.group_id = current_groups.group_id
    group by calls.account_id, calls.group_id, calls.customer_id
)

select * from final
