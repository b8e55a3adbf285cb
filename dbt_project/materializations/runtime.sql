{#
  Macros that read the run (its environment, the relation being built, the warehouse) and return
  values. They live apart from macros/ because sqlfluff's Jinja templater cannot render `return`
  inside nested macro calls; .sqlfluff stubs them as on a full build. Documented where they are
  used: macros/incremental_window.sql.
#}

{% macro loaded_after() -%}
    {%- if execute -%}
        {{ return(env_var('MALLARD_LOADED_AFTER', '') or none) }}
    {%- endif -%}
    {{ return(none) }}
{%- endmacro %}

{% macro merging() -%}
    {%- if not execute -%}
        {{ return(false) }}
    {%- elif model.config.materialized == 'incremental_by_customer' -%}
        {%- set relation = adapter.get_relation(this.database, this.schema, this.table) -%}
        {{ return(relation is not none and not should_full_refresh()) }}
    {%- else -%}
        {{ return(is_incremental()) }}
    {%- endif -%}
{%- endmacro %}

{% macro set_hash_bits(name, keys_sql) -%}
    {%- if execute -%}
        {%- do run_query(
            "set variable " ~ name ~ " = (select bitstring_agg("
            ~ "(hash(k) % 4194304)::integer, 0, 4194303) from (" ~ keys_sql ~ ") as keys(k))"
        ) -%}
    {%- endif -%}
{%- endmacro %}
