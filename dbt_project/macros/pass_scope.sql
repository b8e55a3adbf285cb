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
    {#- The strategy per_customer reads int_customers_changed: a dependency of the model too. -#}
    {%- set changed = ref('int_customers_changed') -%}
    {%- set scoped = ref('int_pass_customer_messages') -%}
    {%- set everything = ref('int_messages_identified') -%}
    {{- scoped if is_incremental() else everything -}}
{%- endmacro %}

{#
  The column of a per-customer model (strategy per_customer) that says which pass wrote the
  row: its window end (see where_customer_changed(rewritten=true)). Appended to stored tables of
  an earlier version by `on_schema_change='append_new_columns'` (null there: not this pass).
#}
{% macro written_by_pass() -%}
    {{ pass_through() }} as pass_through
{%- endmacro %}
