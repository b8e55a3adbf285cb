{#
  The event action of a message: its type for identify/page/screen/group/alias, and for track the
  snake_case of the event name: 'Logged In' -> logged_in, 'email opened' -> email_opened,
  'OrderCompleted' -> order_completed, 'APIKeyCreated' -> api_key_created, 'send-SMS!' -> send_sms,
  'Café Visited' -> café_visited. Letters and digits of any script are kept (\p{L}, \p{N}), so
  a name in another script does not collapse to an empty action.
#}
{% macro event_action(type_col, event_col) -%}
    case
        when {{ type_col }} <> 'track' then {{ type_col }}
        else regexp_replace(
            regexp_replace(
                lower(regexp_replace(
                    regexp_replace({{ event_col }}, '(\p{Lu})(\p{Lu}\p{Ll})', '\1_\2', 'g'),
                    '([\p{Ll}\p{N}])(\p{Lu})', '\1_\2', 'g')),
                '[^\p{L}\p{N}]+', '_', 'g'),
            '^_+|_+$', '', 'g')
    end
{%- endmacro %}
