{#
  The firstEvent or lastEvent object of a customer (end_of_history 'first' or 'last'), as text:
  an aggregate over the customer's rows of customer_event_objects, members in event action order
  (each member's text starts with its action as a JSON string, so sorting the texts sorts by
  action). list(), then sorted per customer: string_agg, ordered or not, ran out of memory
  (18.8 GiB) on a full scan of the customers view at 10M messages, 1M customers; this one peaked
  at 13 GB RSS in 29.5 s.
#}
{% macro event_members(end_of_history) -%}
    '{' || array_to_string(list_sort(coalesce(
        list(to_json(event_action)::varchar || ':' || event_object::varchar)
            filter (where end_of_history = '{{ end_of_history }}'),
        []
    )), ',') || '}'
{%- endmacro %}
