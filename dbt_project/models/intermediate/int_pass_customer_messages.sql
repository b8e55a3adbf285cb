-- One row per deduplicated message of every customer the pass changes (int_customers_changed),
-- from all history: what a per-customer model rebuilt from its customers' messages reads on an
-- incremental pass (macro pass_customer_messages()); its rows of those customers are replaced
-- (strategy per_customer). Ephemeral: built into the models that read it, none by default.
{{ config(materialized='ephemeral') }}

with messages as (
    select * from {{ ref('int_messages_identified') }}
),

changed as (
    select * from {{ ref('int_customers_changed') }}
),

final as (
    select messages.*
    from messages
    semi join changed on messages.customer_id = changed.customer_id
)

select * from final
