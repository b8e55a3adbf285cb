{#
  The event action of a message: its type for identify/page/screen/group/alias, and for track the
  snake_case of the event name: 'Logged In' -> logged_in, 'email opened' -> email_opened,
  'OrderCompleted' -> order_completed, 'send-SMS!' -> send_sms.
#}
{% macro event_action(type_col, event_col) -%}
    case
        when {{ type_col }} <> 'track' then {{ type_col }}
        else regexp_replace(
            lower(regexp_replace(
                regexp_replace({{ event_col }}, '([a-z0-9])([A-Z])', '\1_\2', 'g'),
                '[^A-Za-z0-9]+', '_', 'g')),
            '^_+|_+$', '', 'g')
    end
{%- endmacro %}
