{#
  The order of INTERFACE.md 2.5 between messages for one key: event time, then receipt, then
  messageId. The latest value of a trait or a preference wins (arg_max by it); the first
  message, and the userId an anonymousId was first identified with, by arg_min.
#}
{% macro event_order() -%}
    (event_time, received_at, message_id)
{%- endmacro %}
