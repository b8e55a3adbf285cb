{#
  Every data file of the model records min/max for every column that holds values. DuckLake
  (1.5.5) records none for a column when one of the file's row groups is all null, and then
  prunes that file from `where col = ...` as soon as another file of the table has stats: rows
  silently missing from SQL answers. Fails with the file and column.
#}
{% test ducklake_stats_complete(model) %}
    {%- set meta = '__ducklake_metadata_' ~ model.database -%}
    select
        files.path,
        columns.column_name
    from {{ meta }}.ducklake_data_file as files
    inner join {{ meta }}.ducklake_table as tables on files.table_id = tables.table_id
    inner join {{ meta }}.ducklake_schema as schemas on tables.schema_id = schemas.schema_id
    inner join {{ meta }}.ducklake_file_column_stats as stats
        on files.data_file_id = stats.data_file_id
    inner join {{ meta }}.ducklake_column as columns
        on stats.table_id = columns.table_id and stats.column_id = columns.column_id
    where
        tables.table_name = '{{ model.identifier }}'
        and schemas.schema_name = '{{ model.schema }}'
        and files.end_snapshot is null
        and tables.end_snapshot is null
        and columns.end_snapshot is null
        and stats.min_value is null
        and stats.value_count > 0
{% endtest %}
