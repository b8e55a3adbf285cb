{#
  The order between messages for one key: event time, then receipt, then
  messageId. The latest value of a trait or a preference wins (arg_max by it); the first
  message, and the userId an anonymousId was first identified with, by arg_min. The event
  objects (firstEvent/lastEvent) break the last tie by eventId (`last_tie`).
#}
{% macro event_order(last_tie='message_id') -%}
    (event_time, received_at, {{ last_tie }})
{%- endmacro %}
