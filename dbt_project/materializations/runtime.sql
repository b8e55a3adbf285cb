{#
  Macros that read the run (its environment, the relation being built, the warehouse) and return
  values. They live apart from macros/ because sqlfluff's Jinja templater cannot render `return`
  inside nested macro calls; .sqlfluff stubs them as on a full build. Documented where they are
  used: macros/pass_scope.sql and macros/fold_state.sql.
#}

{#
  The window of the pass being built, from the scope model int_pass_window: {'after': ISO text
  or none, 'through': ISO text or none}. Read once per model: the first call stores it in the
  model's context. Found through the graph, not `ref`: tests call it too (test_scope.sql), and a
  ref taken only at run time is one dbt did not record. The models that need the window first
  (int_messages_deduped, int_identity_map) ref int_pass_window, so it is built before them.
  Before int_pass_window exists (a first build's compile), and in unit tests: no bounds.
#}
{% macro pass_window() -%}
    {#- Unit tests (no graph) check the SQL on the rows they give: no bounds. -#}
    {%- if not execute or 'nodes' not in graph -%}
        {{ return({'after': none, 'through': none}) }}
    {%- endif -%}
    {%- if model is mapping and 'mallard_pass_window' in model -%}
        {{ return(model['mallard_pass_window']) }}
    {%- endif -%}
    {%- set node = graph.nodes.values()
        | selectattr('resource_type', 'equalto', 'model')
        | selectattr('name', 'equalto', 'int_pass_window') | first -%}
    {%- set relation = adapter.get_relation(node.database, node.schema, node.alias) -%}
    {%- set window = {'after': none, 'through': none} -%}
    {%- if relation is not none -%}
        {%- set iso = "strftime(timezone('UTC', {}), '%Y-%m-%dT%H:%M:%S.%f+00:00')" -%}
        {%- set row = run_query(
            'select ' ~ iso.format('loaded_after') ~ ', ' ~ iso.format('loaded_through')
            ~ ' from ' ~ relation
        ).rows[0] -%}
        {%- do window.update({'after': row[0], 'through': row[1]}) -%}
    {%- endif -%}
    {%- if model is mapping -%}
        {%- do model.update({'mallard_pass_window': window}) -%}
    {%- endif -%}
    {{ return(window) }}
{%- endmacro %}

{% macro loaded_after() -%}
    {{ return(pass_window()['after']) }}
{%- endmacro %}

{% macro loaded_through() -%}
    {{ return(pass_window()['through']) }}
{%- endmacro %}

{#
  Whether this dbt invocation builds the model `name` (it is among dbt's selected resources): a
  rest pass builds every model but the served ones, a Dagster launch the assets it selects.
  False outside a run (selected_resources is empty while dbt parses).
#}
{% macro builds_model(name) -%}
    {{ return(execute and ('model.' ~ project_name ~ '.' ~ name) in selected_resources) }}
{%- endmacro %}

{% macro merging() -%}
    {%- if not execute -%}
        {{ return(false) }}
    {%- elif model.config.materialized == 'incremental_by_customer' and not in_unit_test() -%}
        {%- set relation = adapter.get_relation(this.database, this.schema, this.table) -%}
        {{ return(relation is not none and not should_full_refresh()) }}
    {%- else -%}
        {{ return(is_incremental()) }}
    {%- endif -%}
{%- endmacro %}

{#
  Whether the model compiles for a dbt unit test, which has no graph. Its inputs are rows in CTEs
  of the test's one query, which a query a macro runs on its own cannot read.
#}
{% macro in_unit_test() -%}
    {{ return(execute and 'nodes' not in graph) }}
{%- endmacro %}

{% macro set_hash_bits(name, keys_sql) -%}
    {%- if execute and not in_unit_test() -%}
        {%- do run_query(
            "set variable " ~ name ~ " = (select bitstring_agg("
            ~ "(hash(k) % 4194304)::integer, 0, 4194303) from (" ~ keys_sql ~ ") as keys(k))"
        ) -%}
    {%- endif -%}
{%- endmacro %}
