"""Root Dagster definitions: `dagster-webserver -m orchestration.definitions`.

MALLARD_DATA_DIR names the data dir (default ./data); DAGSTER_HOME is <data dir>/dagster.
"""

from orchestration.context import data_paths
from orchestration.defs import build_definitions

defs = build_definitions(data_paths().root)
