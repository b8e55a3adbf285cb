{#
  A model's grain over several columns: no combination occurs twice and no part is null
  (the multi-column form of unique + not_null; dbt_utils is not installed offline).
#}
{% test unique_combination(model, columns) %}
select {{ columns | join(', ') }}, count(*) as n
from {{ model }}
group by {{ columns | join(', ') }}
having count(*) > 1 or {{ columns | join(' is null or ') }} is null
{% endtest %}
