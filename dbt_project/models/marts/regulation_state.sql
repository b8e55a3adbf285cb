-- One row per (account, userId) under a regulation that hides their data from every served
-- table: state is 'suppressed' or 'deleted'. Empty until regulations exist; every served mart
-- already filters through it.
with final as (
    select
        cast(null as varchar) as account_id,
        cast(null as varchar) as user_id,
        cast(null as varchar) as state,
        cast(null as timestamptz) as since
    where false
)

select * from final
