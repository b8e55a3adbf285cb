"""The distributed topology's configuration: off by default, read from the environment, the
attach and the S3 secret it makes (the topology itself: tests/distributed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mallard.distributed import storage
from mallard.offline import dagster_yaml
from mallard.paths import DataPaths
from mallard.topology import dagster_storage_yaml
from mallard.warehouse import lake_attach_sql

VARS = (
    "MALLARD_LAKE_CATALOG",
    "MALLARD_LAKE_DATA_URL",
    "MALLARD_LANDING_URL",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VARS:
        monkeypatch.delenv(name, raising=False)


def test_off_by_default(tmp_path: Path) -> None:
    paths = DataPaths(tmp_path)
    assert not storage().distributed and not storage().uses_s3
    assert lake_attach_sql(paths, read_only=True) == (
        f"ATTACH IF NOT EXISTS 'ducklake:sqlite:{paths.lake_catalog}' AS lake"
        f" (DATA_PATH '{paths.lake_data}/', READ_ONLY)"
    )


def test_postgres_catalog_and_s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLARD_LAKE_CATALOG", "postgres:dbname=lake host=db user=o'neil")
    monkeypatch.setenv("MALLARD_LAKE_DATA_URL", "s3://bucket/lake")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000/")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "it's secret")
    where = storage()
    assert where.on_postgres and where.uses_s3 and where.distributed
    assert where.data_url == "s3://bucket/lake/"
    assert (where.s3_endpoint, where.s3_use_ssl, where.s3_region) == (
        "127.0.0.1:9000",
        False,
        "eu-west-1",
    )
    assert lake_attach_sql(DataPaths(tmp_path)) == (
        "ATTACH IF NOT EXISTS 'ducklake:postgres:dbname=lake host=db user=o''neil' AS lake"
        " (DATA_PATH 's3://bucket/lake/')"
    )
    sql = where.s3_secret_sql()
    assert "secret 'it''s secret'" in sql and "endpoint '127.0.0.1:9000'" in sql
    assert "use_ssl false" in sql and "temporary" in sql


def test_aws_endpoint_defaults_to_tls() -> None:
    assert storage().s3_use_ssl and storage().s3_endpoint == ""


def test_dagster_storage_on_postgres_keeps_the_rest() -> None:
    text = dagster_storage_yaml(dagster_yaml("") or "")
    cfg = yaml.safe_load(text)
    assert cfg["telemetry"] == {"enabled": False}
    assert cfg["storage"] == {"postgres": {"postgres_url": {"env": "MALLARD_DAGSTER_PG_URL"}}}
    assert dagster_yaml(text) is None  # telemetry stays off once storage is added
