"""Query parameters of the list endpoints (INTERFACE.md 4.3, 4.4), parsed and checked."""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

from mallard.errors import InvalidRequest, ValidationFailed

MAX_SIZE = 100
DEFAULT_SIZE = 100
MAX_DEPTH = 10_000  # from + size may page through at most this many results
ID_TYPES = ("userId", "email", "id")


@dataclass(frozen=True)
class EventQuery:
    include: str | None = None
    exclude: tuple[str, ...] = ()
    start: datetime | None = None
    end: datetime | None = None
    sort: str = "desc"
    offset: int = 0
    size: int = DEFAULT_SIZE


def _int(params: dict[str, str], name: str, default: int) -> int:
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise InvalidRequest(f'"{name}" must be an integer, got {raw[:40]!r}') from None


def _time(params: dict[str, str], name: str) -> datetime | None:
    raw = params.get(name)
    if not raw:
        return None
    try:
        t = datetime.fromisoformat(raw.replace(" ", "+"))
    except ValueError:
        try:
            d = date.fromisoformat(raw)
        except ValueError:
            raise InvalidRequest(
                f'"{name}" must be an ISO-8601 date or date-time, got {raw[:40]!r}'
            ) from None
        t = datetime(d.year, d.month, d.day)
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t


def page(params: dict[str, str]) -> tuple[int, int]:
    """(from, size) with the interface's bounds."""
    offset = _int(params, "from", 0)
    size = _int(params, "size", DEFAULT_SIZE)
    if not 1 <= size <= MAX_SIZE:
        raise InvalidRequest(f'"size" must be between 1 and {MAX_SIZE}, got {size}')
    if offset < 0:
        raise InvalidRequest(f'"from" must be 0 or more, got {offset}')
    if offset + size > MAX_DEPTH:
        raise InvalidRequest(
            f'"from" + "size" must not exceed {MAX_DEPTH}; use scrollId to go deeper'
        )
    return offset, size


def event_query(params: dict[str, str]) -> EventQuery:
    sort = (params.get("sort") or "desc").lower()
    if sort not in ("asc", "desc"):
        raise InvalidRequest(f'"sort" must be asc or desc, got {sort[:20]!r}')
    offset, size = page(params)
    start, end = _time(params, "start"), _time(params, "end")
    if start and end and start > end:
        raise InvalidRequest('"start" must be before "end"')
    exclude = tuple(x.strip() for x in (params.get("exclude") or "").split(",") if x.strip())
    include = (params.get("include") or "").strip() or None
    return EventQuery(include, exclude, start, end, sort, offset, size)


def profile_id(raw: str) -> tuple[str, str]:
    """`idType:id` -> (idType, id)."""
    id_type, sep, value = raw.partition(":")
    if not sep or not value or id_type not in ID_TYPES:
        raise ValidationFailed(
            f"profile id must be idType:id with idType one of {', '.join(ID_TYPES)},"
            f" got {raw[:80]!r}"
        )
    return id_type, value


def encode_scroll(state: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(state, separators=(",", ":")).encode()).decode()


def decode_scroll(token: str) -> dict[str, Any]:
    try:
        state = json.loads(base64.urlsafe_b64decode(token.encode()))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise InvalidRequest("scrollId is not valid") from None
    if not isinstance(state, dict) or not isinstance(state.get("v"), int):
        raise InvalidRequest("scrollId is not valid")
    return state
