{#
  Folding per-customer state: the machinery of the project's own per-customer models
  (int_customer_traits, customer_profiles, the candidates in schema `state`), which fold a pass's
  messages into state they keep per customer instead of reading each changed customer's history.
  A new model can use pass_customer_messages() instead (docs/incremental-models.md).
#}

{#
  Incremental passes merge instead of recomputing. A per-customer model keeps, per customer, the
  state its answer is folded from (winners with their ordering keys, min and max times), and a
  pass folds into the stored state of each changed customer only the messages the pass rewrote
  (`pass_through` in the window: new, or attributed again). Folding a message in twice changes
  nothing. A customer that lost a message (to another customer, or to an earlier-received copy)
  cannot be folded (a winner may be gone): it is rebuilt from all its messages
  (int_customers_changed.rebuild), as is every customer on a first build.

  merging(): whether this model run folds into stored state (an incremental pass), rather than
  building whole.
#}

{#
  The rows of a message-grain input (int_messages_identified, int_trait_history) a pass folds in:
  those of the messages it rewrote, and every row of the customers it rebuilds; also a chunk of
  customers for incremental_by_customer. Two selects, not one `or`: DuckDB prunes the input's
  files by `pass_through` only for a plain comparison, and skips the second scan when no customer
  is rebuilt (an `or` with a subquery read every message's columns: 3.7 s at 10M). The ref is
  taken whatever the mode, so dbt always knows the model depends on the list of changed customers.
#}
{% macro merge_input(relation, columns, col='customer_id') -%}
    {%- set changed = ref('int_customers_changed') %}
    select
        {{ columns | join(',\n        ') }}
    from {{ relation }}
    where {{ customer_chunk(col) }}
    {%- if merging() %}
        and {{ in_window('pass_through') }}
    union all
    select
        {{ columns | join(',\n        ') }}
    from {{ relation }}
    where
        {{ customer_chunk(col) }}
        and not ({{ in_window('pass_through') }})
        and {{ col }} in (select customer_id from {{ changed }} where rebuild)
    {%- endif -%}
{%- endmacro %}

{#
  The stored rows of a per-customer model (or of a per-customer input it reads) for the customers
  a pass folds into; none on a build from scratch.
#}
{% macro where_stored_merged(col='customer_id') -%}
    {%- set changed = ref('int_customers_changed') %}
    {%- if merging() %}
    where
        {{ changed_bits_filter(col) }}
        and {{ col }} in (
            select customer_id from {{ changed }}
            where not rebuild and {{ customer_chunk('customer_id') }}
        )
    {%- else %}
    where false
    {%- endif -%}
{%- endmacro %}

{#
  The rows of a per-customer input for every customer a pass changes (all on a full build).
  rewritten=true: the input is a per-customer model this pass already ran (strategy
  per_customer), which wrote every row of every changed customer again, each with this
  pass's window end (written_by_pass()). Its changed customers' rows are then those of
  `pass_through = this pass`, a plain comparison DuckDB answers from the files' min/max: it reads
  the few files the pass wrote, not every file of the table (at 10M messages, a pass's 94k of 1M
  customers are on every page: the winners of the customers model took 2.5 s of scan that way).
  The changed-customer filter stays beside it: a pass with no new load has the window end of the
  pass before it. Only when the orchestrator gives the window end: without it pass_through() is
  now(), which differs between statements.
#}
{% macro where_customer_changed(col='customer_id', rewritten=false) -%}
    {%- set changed = ref('int_customers_changed') %}
    {%- if merging() %}
    where
        {{ changed_bits_filter(col) }}
        and {{ col }} in (
            select customer_id from {{ changed }} where {{ customer_chunk('customer_id') }}
        )
        {%- if rewritten and loaded_through() %}
        and pass_through = {{ pass_through() }}
        {%- endif %}
    {%- else %}
    where {{ customer_chunk(col) }}
    {%- endif -%}
{%- endmacro %}

{#
  A filter DuckDB applies inside the scan of a table, before it reads the other columns of a row:
  a bitmap of the hashes of a set of keys (4M bits, 512 KB), kept in a DuckDB variable on the
  model's connection. A pass's keys (changed customers, messages to attribute again) are spread
  over every file, and a semi join alone reads every row's columns first: at 10M messages,
  reading the stored customers of a pass (94k of 1.2M) took 3.7 s that way and 0.8 s behind this
  filter. A hash collision lets a few other rows through; the exact semi join beside it decides.
  It must be the only expression on its column in the scan's where: DuckDB (1.5.5) pushes two
  such expressions on one column (the bitmap and a chunk's hash test) into no scan, and then
  reads every row's columns (a pass of 1,000 messages read the stored customers in 4.5 s, not
  0.15 s). So the filters of changed customers test the chunk on the list of changed customers.
  set_hash_bits(name, keys_sql) runs while the model compiles; keys_sql selects one column.
#}

{#- In a unit test no bitmap is set (see in_unit_test): the exact filter beside it decides. -#}
{% macro hash_bits_filter(name, col) -%}
    {%- if in_unit_test() -%}
    true
    {%- else -%}
    coalesce(get_bit(getvariable('{{ name }}'), (hash({{ col }}) % 4194304)::integer) = 1, false)
    {%- endif -%}
{%- endmacro %}

{% macro changed_bits_filter(col) -%}
    {{ set_hash_bits(
        'mallard_changed_bits',
        'select customer_id from ' ~ ref('int_customers_changed')
    ) }}
    {{- hash_bits_filter('mallard_changed_bits', col) }}
{%- endmacro %}

{#
  incremental_by_customer runs the model once per chunk of customers, replacing the placeholders;
  other materializations, and a unit test of any model, take every customer at once.
#}
{% macro customer_chunk(col) -%}
    {%- if execute and model.config.materialized == 'incremental_by_customer'
        and not in_unit_test() -%}
        hash({{ col }}) % __customer_chunks__ = __customer_chunk__
    {%- else -%}
        true
    {%- endif -%}
{%- endmacro %}
