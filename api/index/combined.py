"""The index of one build: its customers index, and its events index here or in the pages
process."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from api.index.customers import CustomerIndex
from api.index.ducklake_format import Files
from api.index.events import EventIndex
from api.index.hashing import hasher
from api.params import EventQuery
from mallard.warehouse import file_reader


class EventPages(Protocol):
    """Where the events half of an index lives when not in this process (api/pages.py)."""

    def build(self, files: Files, previous: Files | None) -> tuple[tuple[int, ...], bool]: ...

    def page(
        self, files: Files, account_id: str, brand_id: str, q: EventQuery, hashes: list[int] | None
    ) -> list[str]: ...


class Index:
    """Customers and events of one build. The events half lives in the pages process when one
    is given (api/pages.py): then `events` is None and pages come from there."""

    customers: CustomerIndex
    events: EventIndex | None

    def __init__(
        self,
        customers: Files,
        events: Files,
        version: int = 0,
        previous: Index | None = None,
        pages: EventPages | None = None,
    ) -> None:
        """The index of the files of a snapshot (version), updated from an index of an earlier
        snapshot of the same tables when given one."""
        self.version = version
        self.key = (customers, events)
        self.pages = pages
        remote: Future[tuple[tuple[int, ...], bool]] | None = None
        if pages is not None:  # built there while the customers are built here
            remote = _remote_builds.submit(
                pages.build, events, previous.key[1] if previous else None
            )
        conn = file_reader()  # the marts' files: local, or on S3
        try:
            self.customers = CustomerIndex(
                conn, customers, previous.customers if previous else None
            )
            if remote is None:
                self.events = EventIndex(conn, events, previous.events if previous else None)
                self.event_file_rows = self.events.file_rows
                self.events_updated = self.events.updated
        finally:
            conn.close()
        if remote is not None:
            self.events = None
            self.event_file_rows, self.events_updated = remote.result()

    def event_records(
        self, account_id: str, brand_id: str, q: EventQuery, customer_hashes: list[int] | None
    ) -> list[str]:
        """The JSON records of the page q asks for (raises PagesLost when the pages process
        cannot answer from this build's events)."""
        if self.events is None:
            assert self.pages is not None
            return self.pages.page(self.key[1], account_id, brand_id, q, customer_hashes)
        return self.events.records(self.events.page(account_id, brand_id, q, customer_hashes))

    def customer_hashes(self, account_id: str, customer_ids: list[str]) -> list[int]:
        return hasher.many(account_id, customer_ids) if customer_ids else []


# Waits for the pages process's events builds while the customers are built (few at a time).
_remote_builds = ThreadPoolExecutor(2, "events-index-remote")
