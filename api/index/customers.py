"""The customers index: profiles in the profile list's order, by userId, email and id."""

from __future__ import annotations

import bisect
from typing import Self

import duckdb
import numpy as np
import pyarrow as pa

from api.index.ducklake_format import Files, live_rows
from api.index.hashing import hasher
from api.index.sorted_arrays import KeyIndex, inserted, merge, runs_of, search_strings, take_merged
from api.index.table import Change, TableIndex, key_ranges, read_rows

_KEY = {"userId": "user_id", "id": "customer_id", "email": "email_lower"}
_CUSTOMER_COLUMNS = "account_id, user_id, customer_id, email_lower, traits"


class CustomerIndex(TableIndex):
    """Customers ordered by account and customer id (the profile list's order). An update
    finds the place of each new row by Arrow's binary search and copies the runs of kept rows."""

    def __init__(
        self, conn: duckdb.DuckDBPyConnection, files: Files, previous: Self | None = None
    ) -> None:
        super().__init__(conn, files, previous)
        self.rows = len(self.file)

    def _build(self, conn: duckdb.DuckDBPyConnection) -> None:
        live, params = live_rows(self.files)
        # One ORDER BY over the rows of all the files: the list's order across files.
        t = conn.execute(
            f"select {_CUSTOMER_COLUMNS}, file, row from {live} order by account_id, customer_id",
            params,
        ).to_arrow_table()
        self.file = t["file"].to_numpy()
        self.row = t["row"].to_numpy()
        self.cols = {c: t[c].combine_chunks() for c in _KEY.values()}
        self.account = t["account_id"].combine_chunks()
        self.traits = t["traits"].combine_chunks()
        self.accounts = {k[0]: v for k, v in key_ranges(conn, "account_id", self.files).items()}
        self.by = {
            "userId": KeyIndex.build(self.account, self.cols["user_id"]),
            "email": KeyIndex.build(self.account, self.cols["email_lower"]),
            # The list's own order.
            "id": KeyIndex(np.arange(t.num_rows), self.cols["customer_id"], self.accounts),
        }

    def _update(self, conn: duckdb.DuckDBPyConnection, old: Self) -> None:
        change = Change(conn, old.files, old.file, old.row, self.files)
        new = read_rows(
            conn, self.files, change.added, _CUSTOMER_COLUMNS, "account_id, customer_id"
        )
        stay = np.flatnonzero(change.keep)
        accounts = new["account_id"].combine_chunks()
        ins, self.accounts = merge(
            old.accounts,
            change.keep,
            runs_of(accounts),
            search_strings(old.cols["customer_id"], new["customer_id"].combine_chunks()),
        )
        old_at, new_at = inserted(len(stay), ins)
        moved = np.full(len(old.file), -1, np.int64)
        moved[stay] = old_at

        def merged(values: pa.Array, column: str) -> pa.Array:
            return take_merged(values, stay, new[column].combine_chunks(), ins)

        self.file = np.insert(
            change.remap[old.file][stay], ins, new["file"].to_numpy().astype(old.file.dtype)
        )
        self.row = np.insert(old.row[stay], ins, new["row"].to_numpy().astype(old.row.dtype))
        self.cols = {c: merged(old.cols[c], c) for c in _KEY.values()}
        self.account = merged(old.account, "account_id")
        self.traits = merged(old.traits, "traits")
        self.by = {
            "userId": old.by["userId"].updated(
                moved, accounts, new["user_id"].combine_chunks(), new_at
            ),
            "email": old.by["email"].updated(
                moved, accounts, new["email_lower"].combine_chunks(), new_at
            ),
            "id": KeyIndex(np.arange(len(self.file)), self.cols["customer_id"], self.accounts),
        }

    def page(
        self, account_id: str, after: str | None, offset: int, size: int
    ) -> list[tuple[str, str]]:
        """(customer_id, traits) in customer_id order: after a key, then skip offset."""
        lo, hi = self.accounts.get(account_id, (0, 0))
        ids = self.cols["customer_id"]
        if after:
            lo = bisect.bisect_right(range(lo, hi), after, key=lambda i: ids[i].as_py()) + lo
        start = lo + offset
        return [
            (str(ids[i].as_py()), str(self.traits[i].as_py()))
            for i in range(start, min(hi, start + size))
        ]

    def lookup(self, account_id: str, id_type: str, value: str) -> list[tuple[str, str]]:
        """(customer_id, traits) of the customers an idType:id names, by id."""
        if id_type == "email":
            value = hasher.lower(value)
        ids = self.cols["customer_id"]
        rows = sorted((str(ids[i].as_py()), i) for i in self.by[id_type].rows_of(account_id, value))
        return [(cid, str(self.traits[i].as_py())) for cid, i in rows]
