"""The one place the orchestrator changes os.environ: what dbt reads from its environment, set for
the length of a build and put back after it (`dbt_environment`), with the telemetry switches
of mallard/offline.py.

dbt reads its profile (the data dir), the subscription-id key and its own DBT_* settings from
the environment, and a dbt that runs on a thread of the pipeline's process
(orchestration/dbt_in_process.py) reads this process's. Nothing else in the orchestrator reads
the environment during a pass: the data dir comes from the `LakeResource`; where the lake and
the landing files live (PostgreSQL, S3) is the deployment's, read alike by every process of it
through mallard/distributed.py, and handed to dbt's `distributed` target here.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from mallard.offline import TELEMETRY_OFF
from mallard.paths import DataPaths
from mallard.secret import ensure_secret

__all__ = ["TELEMETRY_OFF", "dbt_env", "dbt_environment", "hmac_pads"]


def hmac_pads(secret_hex: str) -> tuple[str, str]:
    """Inner and outer HMAC-SHA256 pads of the key, hex (RFC 2104)."""
    key = bytes.fromhex(secret_hex)
    if len(key) > 64:
        key = hashlib.sha256(key).digest()
    key = key.ljust(64, b"\0")
    return bytes(b ^ 0x36 for b in key).hex(), bytes(b ^ 0x5C for b in key).hex()


def dbt_env(paths: DataPaths) -> dict[str, str]:
    """What the dbt project reads from its environment: the data dir (profiles.yml), the
    HMAC pads the customers model computes subscription ids with, and the directory of the
    audience files (read when int_audience_matches runs, not when dbt parses)."""
    from mallard.audiences import DIR_ENV, audiences_dir
    from mallard.config import config_dir
    from mallard.distributed import CATALOG_ENV, DATA_URL_ENV, storage
    from mallard.warehouse import lake_catalog_uri, lake_data_path

    ipad, opad = hmac_pads(ensure_secret(paths))
    # The profile's `distributed` target: the lake where mallard/distributed.py says it is.
    on = storage()
    where = (
        {
            "MALLARD_DBT_TARGET": "distributed",
            CATALOG_ENV: lake_catalog_uri(paths),
            DATA_URL_ENV: lake_data_path(paths),
            "MALLARD_S3_ENDPOINT": on.s3_endpoint or "s3.amazonaws.com",
            "MALLARD_S3_REGION": on.s3_region,
            "MALLARD_S3_USE_SSL": "1" if on.s3_use_ssl else "0",
        }
        if on.distributed
        else {}
    )
    return {
        **where,
        "MALLARD_DATA_DIR": str(paths.root),
        DIR_ENV: str(audiences_dir(config_dir())),
        "MALLARD_HMAC_IPAD": ipad,
        "MALLARD_HMAC_OPAD": opad,
        **TELEMETRY_OFF,
    }


@contextmanager
def dbt_environment(
    paths: DataPaths | None = None, extra: Mapping[str, str] | None = None
) -> Iterator[None]:
    """os.environ with `dbt_env(paths)` (when given) and `extra` set, and every variable changed
    meanwhile (these, or any set inside the block) put back as it was on the way out, so one
    build's settings never reach the next pass of a long-lived process."""
    before = dict(os.environ)
    os.environ.update({**(dbt_env(paths) if paths is not None else {}), **(extra or {})})
    try:
        yield
    finally:
        for key in set(before) | set(os.environ):
            if key not in before:
                os.environ.pop(key, None)
            elif os.environ.get(key) != before[key]:
                os.environ[key] = before[key]
