"""The test processes run with the product's telemetry switches (mallard/offline.py) forced, as
every `mallard` command does: unit tests run dbt and Dagster in the pytest process."""

from mallard.offline import force_offline

force_offline()
