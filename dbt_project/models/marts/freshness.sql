-- One row: when the marts were built, the newest receipt they reflect, and the end of the load
-- window this pass took (`loaded_through`): the orchestrator starts the next pass after it, if
-- the models' state is of the same `models_epoch` (dbt_project.yml).
-- Built last (it depends on every served mart), so a pass that fails anywhere leaves the
-- previous row, and the next pass takes the failed pass's messages again.
-- depends_on: {{ ref('events') }}, {{ ref('customers') }}, {{ ref('customer_profiles') }},
-- depends_on: {{ ref('customer_identifiers') }}
-- depends_on: {{ ref('customer_preferences') }}, {{ ref('duplicates') }}
with messages as (
    select * from {{ ref('stg_messages') }}
),

final as (
    select
        now() as built_at,
        max(received_at) as data_through,
        count(*) as messages,
        {{ pass_through() }} as loaded_through,
        {{ var('mallard__models_epoch') }} as models_epoch
    from messages
)

select * from final
