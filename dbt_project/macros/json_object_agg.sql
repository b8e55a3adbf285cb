{#
  An aggregate building one JSON object from key/value rows, keys in sorted order. DuckDB's
  json_group_object is a macro that takes no ORDER BY, so its key order follows row order and
  changes between builds; a stable order keeps the object identical for identical data.
#}
{% macro json_object_agg(key_col, value_col) -%}
    ('{' || string_agg(
        to_json({{ key_col }})::varchar || ':' || ({{ value_col }})::varchar, ','
        order by {{ key_col }}
    ) || '}')::json
{%- endmacro %}
