{#
  The incremental window of a pipeline pass, as the models see it. The orchestrator appends each
  pass's window to the pass manifest (lake.state.pass_manifest) before dbt runs; the scope model
  int_pass_window holds the newest, and pass_window() (materializations/runtime.sql) reads it
  when a model runs. A pass takes every message loaded after the window end of the last pass that
  finished; a pass that fails leaves that where it was, and the next pass takes the failed pass's
  messages again (every incremental model is idempotent for a message seen twice). Without a
  manifest row an incremental model takes everything: a plain `dbt build` stays correct.
#}

{# The end of this pass's window as a SQL timestamptz; now() without one. #}
{% macro pass_through() -%}
    {%- set through = loaded_through() -%}
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

{# The messages a pass rewrote, for models with rows per message (strategy per_message); all of
   them on a build from scratch. #}
{% macro where_rewritten() -%}
    where {% if is_incremental() %}{{ in_window('pass_through') }}{% else %}true{% endif %}
{%- endmacro %}

{#
  The input of the two incremental patterns, as scope models. A per-message model reads
  pass_messages(): the messages the pass writes again (int_pass_messages) on an incremental run,
  every message (int_messages_identified) on a build from scratch. A per-customer model rebuilt
  from its customers' messages reads pass_customer_messages(): every message of the customers
  the pass changes (int_pass_customer_messages), or every message. Both refs are taken whatever
  the mode, so dbt knows the model depends on both (a unit test of such a model gives both).
  The project's own models read int_messages_identified through where_rewritten() and fold
  (merge_input): the same scope, without an ephemeral input their unit tests would have to give.
#}
{% macro pass_messages() -%}
    {%- set scoped = ref('int_pass_messages') -%}
    {%- set everything = ref('int_messages_identified') -%}
    {{- scoped if is_incremental() else everything -}}
{%- endmacro %}

{% macro pass_customer_messages() -%}
    {%- set scoped = ref('int_pass_customer_messages') -%}
    {%- set everything = ref('int_messages_identified') -%}
    {{- scoped if is_incremental() else everything -}}
{%- endmacro %}

{#
  Whether a row of `alias` has its key (`columns`) among the rows of `relation` (that match
  `where`): a correlated `exists`, which DuckDB plans as a hash semi join on the columns. The row
  constructor it replaces, `(a, b) in (select (a, b) ...)`, hashes a struct per row: at 10M
  events (+100k), deleting a pass's messages from int_trait_history took 0.52-0.57 s that way and
  0.24-0.25 s this way; a pass's 200k of 13.7M event objects, 0.97-1.05 s and 0.59 s.
  Only for a `relation` that is a table of its own (a temp table): onto a filtered scan of a lake
  table, the same delete took 1.1-1.45 s and 2.2-2.9 s (events), so such keys are put in a temp
  table first. The key columns are never null.
#}
{% macro keys_exist(alias, columns, relation, where=none) -%}
    exists (
        select 1 from {{ relation }} as keyed
        where
            {% for col in columns -%}
            keyed.{{ col }} = {{ alias }}.{{ col }}{{ ' and' if not loop.last }}
            {% endfor -%}
            {%- if where %} and {{ where }}{% endif %}
    )
{%- endmacro %}

{#
  The column of a per-customer model (strategy per_customer) that says which pass wrote the
  row: its window end (see where_customer_changed(rewritten=true)). Appended to stored tables of
  an earlier version by `on_schema_change='append_new_columns'` (null there: not this pass).
#}
{% macro written_by_pass() -%}
    {{ pass_through() }} as pass_through
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

{% macro hash_bits_filter(name, col) -%}
    coalesce(get_bit(getvariable('{{ name }}'), (hash({{ col }}) % 4194304)::integer) = 1, false)
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
  other materializations take every customer at once.
#}
{% macro customer_chunk(col) -%}
    {%- if execute and model.config.materialized == 'incremental_by_customer' -%}
        hash({{ col }}) % __customer_chunks__ = __customer_chunk__
    {%- else -%}
        true
    {%- endif -%}
{%- endmacro %}

{#
  The deletion half of the per-customer pattern: every row of the changed customers, so a
  customer that is gone (a visitor now attributed to the user it identified as) leaves no rows
  behind. For a table of candidates a pass appends and a view combines (config
  `appends_candidates`: the event candidates, the identifier sightings): only the rows of the
  customers rebuilt, and, with `message_column`, the rows of the messages the pass writes again
  that were stored before (int_messages_identified.restated; their keys in a temp table, see
  keys_exist: with none, almost every pass, the target is not scanned). Other customers keep
  their rows: the pass's own are combined with them.
#}
{% macro delete_changed_customers(relation, appends_candidates=false, message_column=none) -%}
    {%- set changed = ref('int_customers_changed') %}
    {%- if appends_candidates %}
    {%- if message_column %}
    {{ delete_keyed_rows(relation, '"' ~ relation.identifier ~ '__restated"', [message_column],
        restated_messages(message_column)) }};
    {%- endif %}
    delete from {{ relation }} as target
    where customer_id in (select customer_id from {{ changed }} where rebuild)
    {%- else %}
    delete from {{ relation }} as target
    where customer_id in (select customer_id from {{ changed }})
    {%- endif %}
{%- endmacro %}

{# The changed customers' stored rows of `target` replaced by the rows in `computed`: the strategy
   below, and incremental_by_customer (its own rows, and those of its `commit_with` companions). #}
{% macro replace_changed_customers(
    target, computed, appends_candidates=false, message_column=none
) -%}
    {{ delete_changed_customers(target, appends_candidates, message_column) }};
    insert into {{ target }} by name select * from {{ computed }}
{%- endmacro %}

{# Incremental strategy `per_customer`: the rows of every customer the pass changes replaced by
   the rows the model computed for them (replace_changed_customers). #}
{% macro get_incremental_per_customer_sql(arg_dict) -%}
    {{ replace_changed_customers(
        arg_dict['target_relation'], arg_dict['temp_relation'],
        config.get('appends_candidates', false), config.get('message_column')
    ) }}
{%- endmacro %}

{# The keys (`columns`, named as in int_messages_identified) of the messages the pass writes again
   that were stored before it (int_messages_identified.restated): a message new to the warehouse
   has no rows anywhere yet. #}
{% macro restated_messages(columns) -%}
    {%- set columns = [columns] if columns is string else columns -%}
    select {{ columns | join(', ') }}
    from {{ ref('int_messages_identified') }}
    where {{ in_window('pass_through') }} and restated
{%- endmacro %}

{#
  Incremental strategy `per_message`, for models with rows per message (`unique_key` account_id
  and message_id): delete the rows of every message the pass writes again that were there before
  it (restated_messages(): its copy or its customer may have changed), then insert the rows the
  model computed. Two settings serve the models the pass's scope is made from:
  - `restated_column`: the computed rows flag themselves the keys whose stored rows they replace
    (int_messages_deduped, int_messages_identified, upstream of `restated`); only those are
    deleted, where dbt's delete+insert read the keys of every stored message (0.18 s at 10M).
  - `replace_email_changed`: the model's rows carry the customer's email (events), so the rows
    of every customer whose email the pass changed are replaced too, by a delete of its own
    (joined by `or`, one delete scanned the target even with neither set).
#}
{% macro get_incremental_per_message_sql(arg_dict) -%}
    {%- set key = arg_dict['unique_key'] -%}
    {%- set key = [key] if key is string else key -%}
    {%- if config.get('restated_column') -%}
    {%- set rewritten -%}
    select {{ key | join(', ') }} from {{ arg_dict['temp_relation'] }}
    where {{ config.get('restated_column') }}
    {%- endset -%}
    {%- else -%}
    {%- set rewritten = restated_messages(key) -%}
    {%- endif -%}
    {#- Rendered only when set: email_changed_customers() refs int_customer_traits. -#}
    {%- set email_changed = none -%}
    {%- if config.get('replace_email_changed') -%}
    {%- set email_changed = 'customer_id in (' ~ email_changed_customers() ~ ')' -%}
    {%- endif -%}
    {{ replace_keyed_rows(arg_dict, key, rewritten, email_changed) }}
{%- endmacro %}

{#
  The rows of `relation` whose key (`key`, columns) is among the rows `keys_sql` selects,
  deleted. The keys go in a temp table of their own (`keys`) first (see keys_exist; with a filter
  inside the `exists`, such a delete took 1.3-1.6 s at 10M messages): with none (almost every
  pass) DuckDB does not scan the target at all (0.01 s).
#}
{% macro delete_keyed_rows(relation, keys, key, keys_sql) -%}
    create or replace temp table {{ keys }} as
    {{ keys_sql }};
    delete from {{ relation }} as target
    where {{ keys_exist('target', key, keys) }};
    drop table {{ keys }}
{%- endmacro %}

{# The rows of the keys `keys_sql` selects (and those `also_delete` matches) deleted from the
   target (delete_keyed_rows), then every computed row inserted. #}
{% macro replace_keyed_rows(arg_dict, key, keys_sql, also_delete=none) -%}
    {%- set cols = get_quoted_csv(arg_dict['dest_columns'] | map(attribute='name')) -%}
    {%- set relation = arg_dict['target_relation'] -%}
    {{ delete_keyed_rows(
        relation, '"' ~ arg_dict['temp_relation'].identifier ~ '__keys"', key, keys_sql) }};
    {%- if also_delete %}
    delete from {{ relation }} as target
    where {{ also_delete }};
    {%- endif %}
    insert into {{ relation }} ({{ cols }})
    select {{ cols }} from {{ arg_dict['temp_relation'] }}
{%- endmacro %}

{# The customers whose email a pass changed (int_customer_traits.email_changed_at). #}
{% macro email_changed_customers() -%}
    select customer_id from {{ ref('int_customer_traits') }}
    where {{ in_window('email_changed_at') }}
{%- endmacro %}
