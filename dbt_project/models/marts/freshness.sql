-- One row: when the marts were built, the newest receipt they reflect, how many messages they
-- hold, the pass that built them (`pass_id`, its window in lake.state.pass_manifest) and the
-- last full pass (`full_pass_id`): a served pass builds only the marts the read API serves and
-- carries the full pass over. The orchestrator starts the next served pass after `pass_id`'s
-- window and the next full pass after `full_pass_id`'s (orchestration/window.py).
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

{#- The row this build replaces, for the full pass a served pass carries over (none before the
    first build, or in a row from before the column). #}
{%- set previous = load_relation(this) if execute else none %}
{%- set previous_columns = adapter.get_columns_in_relation(previous) | map(attribute='name') | list
    if previous is not none else [] %}
previous as (
    {%- if 'full_pass_id' in previous_columns %}
    select max(full_pass_id) as full_pass_id from {{ this }}
    {%- elif 'pass_id' in previous_columns %}
    select max(pass_id) as full_pass_id from {{ this }}
    {%- else %}
    select null::bigint as full_pass_id
    {%- endif %}
),

final as (
    select
        now() as built_at,
        max(messages.received_at) as data_through,
        count(*) as messages,
        any_value(pass_window.pass_id) as pass_id,
        case
            when any_value(pass_window.kind) = 'served' then any_value(previous.full_pass_id)
            else any_value(pass_window.pass_id)
        end as full_pass_id
    from messages
    cross join pass_window
    cross join previous
)

select * from final
