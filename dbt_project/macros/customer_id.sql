{# The internal customer id: a stable hash of the account and the customer's identifier. #}
{% macro customer_id(account_col, key_col) -%}
    md5({{ account_col }} || '|' || {{ key_col }})
{%- endmacro %}
