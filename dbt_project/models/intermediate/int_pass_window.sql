-- One row: the window of the pass being built, the newest the orchestrator opened for this
-- version of the models (`mallard__models_epoch`). The models take the messages loaded after
-- `loaded_after` (null: every message) through `loaded_through`; a plain `dbt build` repeats the
-- newest pass, or takes everything on a lake without one. The macro pass_window() reads it when
-- a model runs, so the bounds reach the SQL as constants DuckDB prunes files by.
{{ config(materialized='view') }}

with manifest as (
    select * from {{ ref('stg_pass_manifest') }}
    where models_epoch = {{ var('mallard__models_epoch') }}
),

-- An aggregate, so one row even on a lake without passes (nulls: no bounds). arg_max_null, not
-- arg_max: a whole build's `loaded_after` is null.
final as (
    select
        max(pass_id) as pass_id,
        arg_max_null(loaded_after, pass_id) as loaded_after,
        arg_max_null(loaded_through, pass_id) as loaded_through,
        arg_max_null(kind, pass_id) as kind
    from manifest
)

select * from final
