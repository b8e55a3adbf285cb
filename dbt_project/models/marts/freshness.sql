-- One row: when the marts were built and the newest receipt they reflect.
with messages as (
    select * from {{ ref('stg_messages') }}
),

final as (
    select
        now() as built_at,
        max(received_at) as data_through,
        count(*) as messages
    from messages
)

select * from final
