-- One row per pipeline pass the orchestrator opened: the window of loads it takes.
with manifest as (
    select * from {{ source('state', 'pass_manifest') }}
),

final as (
    select
        pass_id,
        models_epoch,
        loaded_after,
        loaded_through,
        opened_at
    from manifest
)

select * from final
