"""Reads for the API from the warehouse's marts, each request on one committed snapshot.

Every request first fixes the DuckLake snapshot id, then runs all its reads `AT (VERSION =>
v)`: an answer never mixes two builds, and a scrollId pins the snapshot its first page saw.
Traits and event pages come from an in-memory index of the snapshot's files when one is built
(api/index/); otherwise, and for everything else, from SQL on the lake.

The package's modules, lowest first: snapshot (Snapshot and the freshness headers), lake (the
connection, and WouldBlock), serving (which snapshot is served, and its index), as_of (the
answers as of a time), reads (the Warehouse's reads of the marts).
"""

from api.service.lake import WouldBlock
from api.service.reads import Warehouse
from api.service.snapshot import FRESHNESS_HEADERS, Snapshot, freshness_headers, iso

__all__ = ["FRESHNESS_HEADERS", "Snapshot", "Warehouse", "WouldBlock", "freshness_headers", "iso"]
