{#
  The firstEvent or lastEvent object of a customer, as text, in two steps over the customer's
  candidates in customer_event_objects (see there):
  - event_candidates(end_of_history): an aggregate: the list of the customer's candidates for
    that end, each with its action, its order (event_order) and its member text, sorted so that
    each action's winner comes first (`first`: earliest; `last`: latest);
  - event_members(list): the first of each action kept, their texts sorted (each starts with its
    action as a JSON string, so sorting the texts sorts by action) and joined into an object.
  The same winners as the view customer_event_winners, picked inside the per-customer aggregate
  the `customers` view needs anyway: ranking them in the view first took a full scan of the
  `customers` view at 10M messages from 19 s to 44 s and 13 to 20 GB; this way 26 s, 15 GB.
  (A list, then sorted per customer: string_agg, ordered or not, ran out of memory (18.8 GiB) on
  a full scan of the customers view at 10M messages, 1M customers.)
#}
{% macro event_candidates(end_of_history) -%}
    list_sort(coalesce(
        list({
            'event_action': event_action,
            'event_order': {{ event_order('event_id') }},
            'member': to_json(event_action)::varchar || ':' || event_object::varchar
        }) filter (where end_of_history = '{{ end_of_history }}'),
        []
    ), '{{ "ASC" if end_of_history == "first" else "DESC" }}')
{%- endmacro %}

{% macro event_members(candidates) -%}
    '{' || array_to_string(list_sort(list_transform(
        list_filter(
            {{ candidates }},
            (c, i) -> i = 1 or {{ candidates }}[i - 1].event_action != c.event_action
        ),
        c -> c.member
    )), ',') || '}'
{%- endmacro %}
