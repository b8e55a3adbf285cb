{# A timestamptz as an ISO-8601 UTC string with milliseconds, as the API shows times. #}
{% macro iso_ts(col) -%}
    strftime(({{ col }}) at time zone 'UTC', '%Y-%m-%dT%H:%M:%S.%gZ')
{%- endmacro %}
