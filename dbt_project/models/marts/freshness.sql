-- One row: when the marts were built, the newest receipt they reflect, how many messages they
-- hold, and the pass that built them (`pass_id`, its window in lake.state.pass_manifest): the
-- orchestrator starts the next pass after that window.
-- Built last (it depends on every mart), so a pass that fails anywhere leaves the
-- previous row, and the next pass takes the failed pass's messages again.
-- depends_on: {{ ref('events') }}, {{ ref('customers') }}, {{ ref('customer_profiles') }},
-- depends_on: {{ ref('customer_identifiers') }}
-- depends_on: {{ ref('customer_preferences') }}, {{ ref('duplicates') }}
with messages as (
    select * from {{ ref('stg_messages') }}
),

pass_window as (
    select * from {{ ref('int_pass_window') }}
),

final as (
    select
        now() as built_at,
        max(messages.received_at) as data_through,
        count(*) as messages,
        any_value(pass_window.pass_id) as pass_id
    from messages
    cross join pass_window
)

select * from final
