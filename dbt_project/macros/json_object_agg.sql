{#
  An aggregate building one JSON object from key/value rows, keys in sorted order. DuckDB's
  json_group_object is a macro that takes no ORDER BY, so its key order follows row order and
  changes between builds; a stable order keeps the object identical for identical data.
  `sorted=false` leaves the keys in row order: an ordered aggregate sorts every group, 10 s for
  800k values at 10M messages where json_group_object took 4 s and this 1 s.
#}
{% macro json_object_agg(key_col, value_col, sorted=true) -%}
    ('{' || string_agg(
        to_json({{ key_col }})::varchar || ':' || ({{ value_col }})::varchar, ','
        {%- if sorted %}
        order by {{ key_col }}
        {%- endif %}
    ) || '}')::json
{%- endmacro %}
