{#
  Materialization `incremental_by_customer`, for per-customer models too big to build in one
  statement at scale: at 10M messages and 1M customers the customers mart's per-customer JSON
  aggregates (firstEvent/lastEvent) ran out of memory at 18.8 GiB, and such aggregates cannot
  spill to disk. The model's SQL runs once per chunk of customers (the model filters its inputs
  with `where_customer_changed()`), at most `customers_per_chunk` customers a chunk:
  - first build or --full-refresh: every customer, into a new table that replaces the old one
    at commit;
  - later passes: the changed customers' rows are deleted, then rebuilt (as the
    `replace_customers` strategy of the incremental models does); usually one chunk, more when a
    pass changes many customers (a backfill, a plain `dbt build` without a window).
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
    {%- set build = make_intermediate_relation(target) if full else target -%}
    {%- set backup = make_backup_relation(target, 'table') -%}
    {%- if full -%}
        {{ drop_relation_if_exists(load_cached_relation(build)) }}
        {{ drop_relation_if_exists(load_cached_relation(backup)) }}
    {%- else -%}
        {%- call statement('delete_changed') -%}
            {{ delete_changed_customers(target) }}
        {%- endcall -%}
    {%- endif -%}
    {%- for i in range(chunks) -%}
        {%- set sql = compiled_code
            | replace('__customer_chunks__', chunks | string)
            | replace('__customer_chunk__', i | string) -%}
        {%- call statement('main' if loop.last else 'chunk_' ~ i) -%}
            {%- if full and loop.first %}
            create table {{ build }} as select * from ({{ sql }})
            {%- else %}
            insert into {{ build }} by name select * from ({{ sql }})
            {%- endif %}
        {%- endcall -%}
    {%- endfor -%}
    {%- if full -%}
        {%- if existing is not none -%}
            {{ adapter.rename_relation(existing, backup) }}
        {%- endif -%}
        {{ adapter.rename_relation(build, target) }}
    {%- endif -%}
    {{ run_hooks(post_hooks, inside_transaction=True) }}
    {{ adapter.commit() }}
    {%- if full and existing is not none -%}
        {{ adapter.drop_relation(backup) }}
    {%- endif -%}
    {{ run_hooks(post_hooks, inside_transaction=False) }}
    {{ return({'relations': [target]}) }}
{% endmaterialization %}
