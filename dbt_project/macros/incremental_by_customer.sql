{#
  Materialization `incremental_by_customer`, for per-customer models too big to build in one
  statement at scale: at 10M messages and 1M customers the customers mart's per-customer JSON
  aggregates (firstEvent/lastEvent) ran out of memory at 18.8 GiB, and such aggregates cannot
  spill to disk.
  - First build or --full-refresh: the model's SQL runs once per chunk of customers (config
    `chunks`, default 8; the model filters its inputs with `customers_of_this_pass()`) into a new
    table that replaces the old one at commit, so a build holds one chunk's aggregates at a time.
  - Later passes: the changed customers' rows are deleted and rebuilt, as the `replace_customers`
    strategy of the incremental models does.
#}
{% materialization incremental_by_customer, adapter='duckdb' %}
    {%- set target = this.incorporate(type='table') -%}
    {%- set existing = load_cached_relation(this) -%}
    {%- set full = existing is none or should_full_refresh() -%}
    {%- set chunks = config.get('chunks', 8) -%}
    {{ run_hooks(pre_hooks, inside_transaction=False) }}
    {{ run_hooks(pre_hooks, inside_transaction=True) }}
    {%- if full -%}
        {%- set build = make_intermediate_relation(target) -%}
        {%- set backup = make_backup_relation(target, 'table') -%}
        {{ drop_relation_if_exists(load_cached_relation(build)) }}
        {{ drop_relation_if_exists(load_cached_relation(backup)) }}
        {%- for i in range(chunks) -%}
            {%- set sql = compiled_code
                | replace('__customer_chunks__', chunks | string)
                | replace('__customer_chunk__', i | string) -%}
            {%- call statement('main' if loop.last else 'chunk_' ~ i) -%}
                {%- if loop.first %}
                create table {{ build }} as select * from ({{ sql }})
                {%- else %}
                insert into {{ build }} by name select * from ({{ sql }})
                {%- endif %}
            {%- endcall -%}
        {%- endfor -%}
        {%- if existing is not none -%}
            {{ adapter.rename_relation(existing, backup) }}
        {%- endif -%}
        {{ adapter.rename_relation(build, target) }}
    {%- else -%}
        {%- call statement('main') -%}
            delete from {{ target }}
            where customer_id in (select customer_id from {{ ref('int_customers_changed') }});
            insert into {{ target }} by name select * from ({{ compiled_code }})
        {%- endcall -%}
    {%- endif -%}
    {{ run_hooks(post_hooks, inside_transaction=True) }}
    {{ adapter.commit() }}
    {%- if full and existing is not none -%}
        {{ adapter.drop_relation(backup) }}
    {%- endif -%}
    {{ run_hooks(post_hooks, inside_transaction=False) }}
    {{ return({'relations': [target]}) }}
{% endmaterialization %}
