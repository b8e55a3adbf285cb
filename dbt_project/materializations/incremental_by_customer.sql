{#
  Materialization `incremental_by_customer`, for per-customer models too big to build in one
  statement at scale: at 10M messages and 1M customers the customers mart's per-customer JSON
  aggregates (firstEvent/lastEvent) ran out of memory at 18.8 GiB, and such aggregates cannot
  spill to disk. The model's SQL runs once per chunk of customers (the model filters its inputs
  with `where_customer_changed()`), at most `customers_per_chunk` customers a chunk:
  - first build or --full-refresh: every customer, into a new table that replaces the old one
    at commit;
  - later passes: the changed customers' rows are computed (folding into their stored rows),
    then the stored rows deleted and the new ones inserted (as the `per_customer` strategy
    of the incremental models does); usually one chunk, more when a pass changes many customers
    (a backfill, a plain `dbt build` without a window).
  `commit_with`: on a pass, this model's rows are written by the commit of the model named there
  (which must depend on it), in the same DuckLake snapshot as that model's own rows: until then
  they wait in a table of dbt's in-memory database (`<name>__pending`). Two marts the read API
  combines in one answer (customer_event_objects into the `customers` view's metadata, with
  customer_profiles) then never show one pass's rows beside the other's older ones.
#}
{% materialization incremental_by_customer, adapter='duckdb' %}
    {%- set target = this.incorporate(type='table') -%}
    {%- set existing = load_cached_relation(this) -%}
    {%- set full = existing is none or should_full_refresh() -%}
    {%- set changed = ref('int_customers_changed') -%}
    {%- if full -%}
        {%- set count_sql = 'select count(distinct customer_id) from ' ~ ref('int_messages_identified') -%}
    {%- else -%}
        {%- set count_sql = 'select count(*) from ' ~ changed -%}
    {%- endif -%}
    {%- set customers = run_query(count_sql).columns[0].values()[0] -%}
    {%- set per_chunk = config.get('customers_per_chunk', 125000) -%}
    {%- set chunks = [1, ((customers + per_chunk - 1) // per_chunk) | int] | max -%}
    {{ log(this ~ ': ' ~ customers ~ ' customers in ' ~ chunks ~ ' chunks') }}
    {{ run_hooks(pre_hooks, inside_transaction=False) }}
    {{ run_hooks(pre_hooks, inside_transaction=True) }}
    {#- Incrementally the chunks go to a staging table first: the model reads its own stored
        rows (the state it folds into), so they are deleted only after every chunk ran. -#}
    {%- if full -%}
        {%- set build = make_intermediate_relation(target) -%}
        {%- set backup = make_backup_relation(target, 'table') -%}
        {{ drop_relation_if_exists(load_cached_relation(build)) }}
        {{ drop_relation_if_exists(load_cached_relation(backup)) }}
    {%- elif config.get('commit_with') -%}
        {%- set build = pending_relation(target.identifier) -%}
    {%- else -%}
        {%- set build = 'temp.main."' ~ target.identifier ~ '__merge"' -%}
    {%- endif -%}
    {%- for i in range(chunks) -%}
        {%- set sql = compiled_code
            | replace('__customer_chunks__', chunks | string)
            | replace('__customer_chunk__', i | string) -%}
        {#- On a pass, outside the transaction: the chunks only read the lake (into a temp table or
            dbt's in-memory database); the transaction that writes the lake begins with the
            replacing below. A full build writes its new table in the transaction. -#}
        {%- call statement('chunk_' ~ i, auto_begin=full) -%}
            {%- if loop.first %}
            create {{ 'table' if full else 'or replace table' if config.get('commit_with')
                else 'or replace temp table' }} {{ build }} as select * from ({{ sql }})
            {%- else %}
            insert into {{ build }} by name select * from ({{ sql }})
            {%- endif %}
        {%- endcall -%}
    {%- endfor -%}
    {%- if full -%}
        {%- call statement('main') -%}
            select 1
        {%- endcall -%}
        {%- if existing is not none -%}
            {{ adapter.rename_relation(existing, backup) }}
        {%- endif -%}
        {{ adapter.rename_relation(build, target) }}
    {%- elif config.get('commit_with') -%}
        {#- Written by the commit of the model named in commit_with. -#}
        {%- call statement('main') -%}
            select 1
        {%- endcall -%}
    {%- else -%}
        {%- call statement('main') -%}
            {{ replace_changed_customers(
                target, build, config.get('appends_candidates', false),
                config.get('message_column')) }};
            drop table {{ build }}
        {%- endcall -%}
    {%- endif -%}
    {{ write_pending_companions() }}
    {{ run_hooks(post_hooks, inside_transaction=True) }}
    {{ adapter.commit() }}
    {{ drop_pending_companions() }}
    {%- if full and existing is not none -%}
        {{ adapter.drop_relation(backup) }}
    {%- endif -%}
    {{ run_hooks(post_hooks, inside_transaction=False) }}
    {{ return({'relations': [target]}) }}
{% endmaterialization %}

{# Where a `commit_with` model's rows of a pass wait: dbt's in-memory database, which the models
   of one dbt invocation share (temp tables belong to one connection, and each model has its
   own). #}
{% macro pending_relation(identifier) -%}
    memory.main."{{ identifier }}__pending"
{%- endmacro %}

{# The models whose rows a model's commit writes (`commit_with` naming it). #}
{% macro commit_companions() -%}
    {{ return(graph.nodes.values()
        | selectattr('resource_type', 'equalto', 'model')
        | selectattr('config.commit_with', 'equalto', model.name) | list) }}
{%- endmacro %}

{# In this model's transaction: the pending rows of the models that commit with it (written
   before it: it depends on them), each replacing its changed customers' rows. #}
{% macro write_pending_companions() -%}
    {%- for node in commit_companions() -%}
        {%- set pending = pending_relation(node.alias) -%}
        {%- set found = run_query(
            "select count(*) from duckdb_tables() where database_name = 'memory'"
            ~ " and schema_name = 'main' and table_name = '" ~ node.alias ~ "__pending'"
        ).columns[0].values()[0] -%}
        {%- if found -%}
            {%- set companion = api.Relation.create(
                database=node.database, schema=node.schema, identifier=node.alias) -%}
            {%- call statement('commit_with_' ~ node.name) -%}
                {{ replace_changed_customers(
                    companion, pending, node.config.get('appends_candidates', false),
                    node.config.get('message_column')) }}
            {%- endcall -%}
        {%- endif -%}
    {%- endfor -%}
{%- endmacro %}

{# After the commit (a transaction that wrote the lake may not write dbt's in-memory database),
   each drop committing on its own: a transaction begun here would stay open, and the drop of
   the replaced table's backup that follows would end with it, uncommitted. #}
{% macro drop_pending_companions() -%}
    {%- for node in commit_companions() -%}
        {%- call statement('drop_pending_' ~ node.name, auto_begin=False) -%}
            drop table if exists {{ pending_relation(node.alias) }}
        {%- endcall -%}
    {%- endfor -%}
{%- endmacro %}
