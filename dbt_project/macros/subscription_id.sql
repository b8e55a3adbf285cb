{#
  HMAC-SHA256(secret, customer id) as hex: DuckDB has sha256 but no hmac, so the orchestrator
  passes the key's inner and outer pads (key xor 0x36 / 0x5c) and this composes the HMAC.
#}
{% macro subscription_id(id_col) -%}
    {%- set ipad = var('mallard__hmac_ipad') -%}
    {%- set opad = var('mallard__hmac_opad') -%}
    {%- if ipad and opad -%}
    sha256(unhex('{{ opad }}') || unhex(sha256(unhex('{{ ipad }}') || ({{ id_col }})::blob)))
    {%- else -%}
    cast(null as varchar)
    {%- endif -%}
{%- endmacro %}
