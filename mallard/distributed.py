"""Where the lake's catalog, its data files and the landing files live: the data dir by default,
PostgreSQL and S3-compatible storage when Mallard runs on several machines (docs/deploy.md).

Read from the environment of each process, so the collectors, the API replicas, the pipeline
and dbt of one deployment agree. S3 is configured by the AWS SDKs' own variables, which DuckDB's
secret (made here), pyarrow (the read index, the roller) and boto3 all follow: AWS_ENDPOINT_URL
for an S3-compatible server (http://host:port), AWS_REGION or AWS_DEFAULT_REGION. Credentials
come from the environment only, never from a file Mallard writes: AWS_ACCESS_KEY_ID /
AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN); the PostgreSQL password from PGPASSWORD (libpq
reads it itself).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow.fs

# The environment variables of the distributed topology (all unset: the embedded default).
CATALOG_ENV = "MALLARD_LAKE_CATALOG"  # postgres:dbname=lake host=... port=... user=...
DATA_URL_ENV = "MALLARD_LAKE_DATA_URL"  # s3://bucket/prefix/ for the lake's data files
LANDING_URL_ENV = "MALLARD_LANDING_URL"  # s3://bucket/prefix/ for the landing files
S3_URL_STYLE_ENV = "MALLARD_S3_URL_STYLE"  # path (MinIO, moto, Ceph; the default) or vhost
DAGSTER_PG_ENV = "MALLARD_DAGSTER_PG_URL"  # postgresql://user@host:port/db for Dagster's instance


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _slash(url: str) -> str:
    return url if not url or url.endswith("/") else url + "/"


@dataclass(frozen=True)
class Storage:
    """The places one deployment's processes share; "" for the data dir's own."""

    catalog: str = ""  # a DuckLake metadata connection string after `ducklake:`
    data_url: str = ""
    landing_url: str = ""
    s3_endpoint: str = ""
    s3_region: str = "us-east-1"
    s3_url_style: str = "path"
    s3_use_ssl: bool = True

    @property
    def on_postgres(self) -> bool:
        return self.catalog.startswith("postgres:")

    @property
    def uses_s3(self) -> bool:
        return self.data_url.startswith("s3://") or self.landing_url.startswith("s3://")

    @property
    def distributed(self) -> bool:
        return bool(self.catalog or self.data_url or self.landing_url)

    def catalog_connect(self):  # type: ignore[no-untyped-def]
        """A psycopg2 connection to the PostgreSQL catalog's database (autocommit), for what
        DuckDB does not do there: VACUUM after a Delete, and the Delete's proof."""
        import psycopg2

        conn = psycopg2.connect(self.catalog.removeprefix("postgres:"))
        conn.autocommit = True
        return conn

    def s3_secret_sql(self) -> str:
        """The DuckDB S3 secret of this process (temporary: it lives in the connection only),
        its keys from the environment."""
        opts = {
            "key_id": os.environ.get("AWS_ACCESS_KEY_ID", ""),
            "secret": os.environ.get("AWS_SECRET_ACCESS_KEY", ""),
            "region": self.s3_region,
            "url_style": self.s3_url_style,
        }
        if token := os.environ.get("AWS_SESSION_TOKEN"):
            opts["session_token"] = token
        if self.s3_endpoint:
            opts["endpoint"] = self.s3_endpoint
        body = ", ".join(f"{k} {_quote(v)}" for k, v in opts.items())
        ssl = "true" if self.s3_use_ssl else "false"
        return f"create or replace temporary secret mallard_s3 (type s3, {body}, use_ssl {ssl})"

    def s3_filesystem(self) -> pyarrow.fs.S3FileSystem:
        """pyarrow's S3 client for the same bucket (the collectors' roller writes landing files
        with it: the collector never opens the warehouse, so never starts a DuckDB)."""
        from pyarrow import fs

        return fs.S3FileSystem(
            access_key=os.environ.get("AWS_ACCESS_KEY_ID") or None,
            secret_key=os.environ.get("AWS_SECRET_ACCESS_KEY") or None,
            session_token=os.environ.get("AWS_SESSION_TOKEN") or None,
            region=self.s3_region,
            scheme="https" if self.s3_use_ssl else "http",
            endpoint_override=self.s3_endpoint or None,
            force_virtual_addressing=self.s3_url_style == "vhost",
        )


def storage() -> Storage:
    """This process's storage, from its environment (read each time: cheap, and tests set it)."""
    env = os.environ.get
    endpoint = env("AWS_ENDPOINT_URL_S3") or env("AWS_ENDPOINT_URL") or ""
    return Storage(
        catalog=env(CATALOG_ENV, ""),
        data_url=_slash(env(DATA_URL_ENV, "")),
        landing_url=_slash(env(LANDING_URL_ENV, "")),
        s3_endpoint=endpoint.split("://", 1)[-1].rstrip("/"),
        s3_region=env("AWS_REGION") or env("AWS_DEFAULT_REGION") or "us-east-1",
        s3_url_style=env(S3_URL_STYLE_ENV, "path"),
        s3_use_ssl=not endpoint.startswith("http://"),
    )
