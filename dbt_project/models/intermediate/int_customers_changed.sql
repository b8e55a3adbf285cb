-- One row per customer whose rows this pass changes: every customer a message rewritten since
-- the last finished pass belongs to now or belonged to then. `rebuild`: the customer lost a
-- message (attributed to another customer now, or replaced by an earlier-received copy), so its
-- per-customer state is rebuilt from all its messages; the others fold the rewritten messages
-- into their stored state (see merging() in macros/fold_state.sql). A pass that died
-- may have changed the state of other customers (those its own attribution gave): its list is
-- kept (`pass_through` in the window) and they are rebuilt. On a full build: every customer.
{%- set stored = adapter.get_relation(this.database, this.schema, this.table)
    if execute and loaded_after() and not should_full_refresh() else none %}
-- depends_on: {{ ref('int_pass_window') }}
with messages as (
    select
        customer_id,
        previous_customer_id,
        replaces_stored
    from {{ ref('int_pass_messages') }}
),

rebuilt as (
    select previous_customer_id as customer_id from messages
    where previous_customer_id is not null and previous_customer_id != customer_id
    union
    select customer_id from messages
    where replaces_stored
    {% if stored is not none -%}
    union
    select customer_id from {{ stored }}
    where {{ in_window('pass_through') }}
    {%- endif %}
),

changed as (
    select customer_id from messages
    union
    select customer_id from rebuilt
),

final as (
    select
        changed.customer_id,
        rebuilt.customer_id is not null as rebuild,
        {{ pass_through() }} as pass_through
    from changed
    left join rebuilt on changed.customer_id = rebuilt.customer_id
)

select * from final
