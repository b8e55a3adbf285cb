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
        opened_at,
        -- 'full' or 'served' (orchestration/window.py PassKind); rows from before: full passes.
        coalesce(kind, 'full') as kind
    from manifest
)

select * from final
