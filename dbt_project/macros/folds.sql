{#
  Fold rules: how a view combines the rows passes append to a candidates table (config
  `appends_candidates`), written once as a DuckDB table macro in the lake, `lake.state.<rule>(t)`
  over the table named `t`. The view over the candidates calls it on its table; compaction
  (orchestration/maintenance.py) calls it on a temp table of the keys with more than one row,
  and keeps only what it returns. The candidates model declares its rule in `meta.fold` (rule,
  key, and `candidate`: the column telling a key's rows apart, when the rule picks one row per
  key), where compaction reads it from dbt's manifest.

  define_fold_rule(rule, body): the statement that (re)creates the rule, a pre-hook of the view
  that calls it, so the rule and the view change together. fold_rule(rule, relation): the rows
  the rule makes of `relation`.
#}
{% macro define_fold_rule(rule, body) -%}
    create or replace macro {{ this.database }}.state.{{ rule }}(candidates) as table
    {{ body }}
{%- endmacro %}

{% macro fold_rule(rule, relation) -%}
    {{ this.database }}.state.{{ rule }}('{{ relation }}')
{%- endmacro %}

{#
  Rule event_winners: per (customer, event action, end of history), the candidate that is first
  (end `first`) or last (end `last`) by event time, then receipt, then eventId. A window over
  each key's candidates, not an aggregate: an aggregate holding every event object holds the
  table in memory on a full scan (its aggregates cannot spill).
#}
{% macro event_winners_rule() -%}
    select *
    from query_table(candidates)
    window
        by_key as (
            partition by customer_id, event_action, end_of_history
            order by {{ event_order('event_id') }}
        )
    qualify row_number() over by_key = case
        when end_of_history = 'first' then 1
        else count(*) over (partition by customer_id, event_action, end_of_history)
    end
{%- endmacro %}

{# Rule identifier_spans: per (customer, identifier type, identifier), the first and last time
   any of its sightings saw it. #}
{% macro identifier_spans_rule() -%}
    select
        customer_id,
        account_id,
        id_type,
        id_value,
        min(first_seen) as first_seen,
        max(last_seen) as last_seen
    from query_table(candidates)
    group by customer_id, account_id, id_type, id_value
{%- endmacro %}
