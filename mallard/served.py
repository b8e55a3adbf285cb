"""The address `mallard serve` listens on, kept in the data dir: the base of the links in messages
(pixel, click redirects, unsubscribe, the preferences page) unless MALLARD_PUBLIC_URL names one.

The dispatcher runs in the pipeline's process, not the server's, so it cannot ask the server;
the server writes the address once it listens (the port it bound, also when `--port 0` chose
one), and every dispatcher of the data dir reads it.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from mallard.paths import DataPaths
from mallard.settings import Settings

# A server bound to every interface is reached on this machine through loopback; customers
# elsewhere need MALLARD_PUBLIC_URL anyway (a proxy, TLS, a domain).
_ANY = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def url(host: str, port: int) -> str:
    """http://host:port, with a wildcard host replaced by loopback and IPv6 in brackets."""
    host = _ANY.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def record(paths: DataPaths, host: str, port: int) -> None:
    """Keep the address the server listens on (written whole: readers never see half)."""
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    tmp = paths.served_url.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(url(host, port) + "\n")
    os.replace(tmp, paths.served_url)


def address(paths: DataPaths) -> str | None:
    """The address the data dir's server last listened on, or None if none has."""
    try:
        text = paths.served_url.read_text().strip()
    except OSError:
        return None
    return text if urlsplit(text).scheme == "http" else None


def link_base(settings: Settings, paths: DataPaths) -> str:
    """The base URL links in messages point at, without a trailing slash: MALLARD_PUBLIC_URL,
    else the address the server listens on, else the settings' host and port."""
    base = settings.public_url or address(paths) or url(settings.host, settings.port)
    return base.rstrip("/")
