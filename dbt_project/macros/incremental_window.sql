{#
  The incremental window of a pipeline pass. The orchestrator passes `mallard__loaded_after`:
  the `loaded_through` of the last pass that finished (lake.marts.freshness), so a pass takes
  every message loaded after it. A pass that fails leaves it where it was, and the next pass takes
  the failed pass's messages again (every incremental model is idempotent for a message seen
  twice). Without the var, an incremental model takes everything: plain `dbt build` stays correct.
#}
{% macro loaded_after() -%}
    {{ return(var('mallard__loaded_after', none)) }}
{%- endmacro %}

{# The end of this pass's window (max loaded_at when the pass began), as a SQL timestamptz. #}
{% macro pass_through() -%}
    {%- set through = var('mallard__loaded_through', none) -%}
    {%- if through -%}
        '{{ through }}'::timestamptz
    {%- else -%}
        now()
    {%- endif -%}
{%- endmacro %}

{% macro in_window(col) -%}
    {%- if loaded_after() -%}
        {{ col }} > '{{ loaded_after() }}'::timestamptz
    {%- else -%}
        true
    {%- endif -%}
{%- endmacro %}

{#
  Per-customer models recompute only the customers int_customers_changed lists, on incremental
  passes; a chunked first build (materialization incremental_by_customer) takes one chunk of
  customers per statement. The ref is taken whatever the mode, so dbt always knows the model
  depends on that list.
#}
{% macro where_customer_changed(col='customer_id') -%}
    {%- set changed = ref('int_customers_changed') -%}
    {%- if execute and model.config.materialized == 'incremental_by_customer' -%}
        {%- set relation = adapter.get_relation(this.database, this.schema, this.table) %}
    where hash({{ col }}) % __customer_chunks__ = __customer_chunk__
        {%- if relation is not none and not should_full_refresh() %}
        and {{ col }} in (select customer_id from {{ changed }})
        {%- endif -%}
    {%- elif is_incremental() %}
    where {{ col }} in (select customer_id from {{ changed }})
    {%- endif -%}
{%- endmacro %}

{#
  Incremental strategy `replace_customers`: delete every row of the changed customers, then insert
  the rows the model computed for them. The deletion set is the changed customers, not the new
  rows, so a customer that is gone (a visitor now attributed to the user it identified as) leaves
  no rows behind.
#}
{% macro delete_changed_customers(relation) -%}
    delete from {{ relation }}
    where customer_id in (select customer_id from {{ ref('int_customers_changed') }})
{%- endmacro %}

{% macro get_incremental_replace_customers_sql(arg_dict) -%}
    {%- set cols = get_quoted_csv(arg_dict['dest_columns'] | map(attribute='name')) -%}
    {{ delete_changed_customers(arg_dict['target_relation']) }};
    insert into {{ arg_dict['target_relation'] }} ({{ cols }})
    select {{ cols }} from {{ arg_dict['temp_relation'] }}
{%- endmacro %}
