-- One row per customer whose rows this pass rebuilds: every customer a message written since
-- the last finished pass belongs to now or belonged to then. The per-customer models delete and
-- rebuild exactly these (strategy `replace_customers`). On a full build: every customer.
with messages as (
    select
        customer_id,
        previous_customer_id
    from {{ ref('int_messages_identified') }}
    where {{ in_window('pass_through') }}
),

final as (
    select customer_id from messages
    union
    select previous_customer_id as customer_id from messages
    where previous_customer_id is not null
)

select * from final
