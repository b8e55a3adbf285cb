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

newest as (
    select * from manifest
    order by pass_id desc
    limit 1
),

final as (
    select
        newest.pass_id,
        newest.loaded_after,
        newest.loaded_through
    from (select 1 as one) as always_one_row
    left join newest on true
)

select * from final
