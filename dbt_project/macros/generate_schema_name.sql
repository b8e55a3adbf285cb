{# Schemas are exactly raw / staging / intermediate / marts, whatever the target's schema. #}
{% macro generate_schema_name(custom_schema_name, node) -%}
    {{ (custom_schema_name or target.schema) | trim }}
{%- endmacro %}
