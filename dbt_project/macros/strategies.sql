{#
  The incremental strategies of the two patterns, `per_message` and `per_customer`
  (docs/incremental-models.md), and the deletes they are made of.
#}

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

{# Incremental strategy `per_customer`: the rows of every customer the pass changes replaced by
   the rows the model computed for them (replace_changed_customers). #}
{% macro get_incremental_per_customer_sql(arg_dict) -%}
    {{ replace_changed_customers(
        arg_dict['target_relation'], arg_dict['temp_relation'],
        config.get('appends_candidates', false), config.get('message_column')
    ) }}
{%- endmacro %}

{#
  The keys (`columns`, named as in int_messages_identified) of the messages the pass writes again
  whose rows a model may hold from before it. A build that writes int_messages_identified flags
  them there (`restated`): every message of its window whose row there was stored before, and a
  model holds rows of a message only once that row is stored. A message new to the warehouse has
  no rows anywhere yet, and is not deleted. A build without it (a rest pass, a selection of
  models) reads `restated` as the pass that wrote those rows set it, which says nothing of this
  model: a message a served pass took first is not restated, yet a rest pass before this one
  (killed before its freshness row, or over a window this one overlaps) wrote this model's rows of
  it. Such a build deletes every message of its window, so the model replaces its rows on their
  key whichever pass wrote them.
#}
{% macro restated_messages(columns) -%}
    {%- set columns = [columns] if columns is string else columns -%}
    select {{ columns | join(', ') }}
    from {{ ref('int_messages_identified') }}
    where {{ in_window('pass_through') }}
    {%- if builds_model('int_messages_identified') %} and restated{% endif %}
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

{# The customers whose email a pass changed (int_customer_traits.email_changed_at). #}
{% macro email_changed_customers() -%}
    select customer_id from {{ ref('int_customer_traits') }}
    where {{ in_window('email_changed_at') }}
{%- endmacro %}
