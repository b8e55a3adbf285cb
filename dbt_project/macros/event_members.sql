{#
  The firstEvent or lastEvent object of a customer (end_of_history 'first' or 'last'), as text:
  an aggregate over the customer's rows of customer_event_objects, members in event action order.
#}
{% macro event_members(end_of_history) -%}
    '{' || coalesce(string_agg(
        to_json(event_action)::varchar || ':' || event_object::varchar, ','
        order by event_action
    ) filter (where end_of_history = '{{ end_of_history }}'), '') || '}'
{%- endmacro %}
