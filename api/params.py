"""Query parameters of the read API: declarations, checks, scroll tokens.

The handlers declare these as typed Litestar parameters, so the OpenAPI document lists exactly
what they accept; the checks Litestar cannot express (from + size depth, start before end,
unknown parameters, scroll tokens) live here.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Annotated, Any, Literal

from litestar import Request
from litestar.params import Parameter, QueryParameter

from mallard.errors import InvalidRequest, ValidationFailed

MAX_SIZE = 100
DEFAULT_SIZE = 100
MAX_DEPTH = 10_000  # from + size may page through at most this many results
ID_TYPES = ("userId", "email", "id")

Include = Annotated[
    str | None,
    Parameter(description="Only events of this one event action (snake_case, e.g. logged_in)."),
]
Exclude = Annotated[
    str | None,
    Parameter(description="Comma-separated event actions to leave out, e.g. page,identify."),
]
Start = Annotated[
    str | None,
    Parameter(
        description="Events after this ISO-8601 date (midnight UTC) or date-time"
        " (UTC unless it carries an offset).",
    ),
]
End = Annotated[
    str | None,
    Parameter(description="Events before this ISO-8601 date (midnight UTC) or date-time."),
]
Sort = Annotated[
    Literal["asc", "desc"],
    Parameter(description="Order by event time; newest first by default."),
]
From = Annotated[
    int,
    QueryParameter(
        name="from",
        ge=0,
        description=f"Hits to skip. from + size may reach at most {MAX_DEPTH:,}; go deeper with"
        " scrollId.",
    ),
]
Size = Annotated[int, Parameter(ge=1, le=MAX_SIZE, description="Page size, 1 to 100.")]
ScrollId = Annotated[
    str | None,
    QueryParameter(
        name="scrollId",
        description="Continue a list from the previous answer's scrollId, on the same"
        " snapshot of the data; the other parameters are those of the first page.",
    ),
]

AsOf = Annotated[
    str | None,
    QueryParameter(
        name="asOf",
        description="Answer as of this ISO-8601 date (midnight UTC) or date-time (UTC unless it"
        " carries an offset): from the messages whose event time is at or before it, with"
        " identity as it stood then. Later messages do not change the answer.",
    ),
]

EVENT_PARAMS = frozenset({"include", "exclude", "start", "end", "sort", "from", "size"})
PROFILE_EVENT_PARAMS = EVENT_PARAMS | {"scrollId"}
ACCOUNT_EVENT_PARAMS = EVENT_PARAMS | {"asOf"}
PROFILE_PARAMS = frozenset({"asOf"})
PROFILE_LIST_PARAMS = frozenset({"from", "size", "scrollId"})


@dataclass(frozen=True)
class EventQuery:
    include: str | None = None
    exclude: tuple[str, ...] = ()
    start: datetime | None = None
    end: datetime | None = None
    sort: str = "desc"
    offset: int = 0
    size: int = DEFAULT_SIZE
    as_of: datetime | None = None  # the events as they stood then (event time <= as_of)


def only(request: Request[Any, Any, Any], allowed: frozenset[str]) -> None:
    """Refuse query parameters a route does not take, so a typo is not silently ignored."""
    unknown = sorted(set(request.query_params) - allowed)
    if unknown:
        raise InvalidRequest(
            f"unknown query parameter {', '.join(unknown)}; this route takes"
            f" {', '.join(sorted(allowed)) or 'none'}"
        )


def check_page(offset: int, size: int) -> None:
    """The depth bound Litestar's per-parameter checks cannot express."""
    if offset + size > MAX_DEPTH:
        raise InvalidRequest(
            f'"from" + "size" must not exceed {MAX_DEPTH}; use scrollId to go deeper'
        )


def _time(name: str, raw: str | None) -> datetime | None:
    if not raw:
        return None
    try:
        # A `+` offset arrives as a space when the caller did not URL-encode it.
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


def as_of(raw: str | None) -> datetime | None:
    """The asOf parameter: None when absent; a bad one is refused like start and end."""
    if raw is not None and not raw.strip():
        raise InvalidRequest('"asOf" must be an ISO-8601 date or date-time, got an empty value')
    return _time("asOf", raw)


def event_query(
    include: str | None = None,
    exclude: str | None = None,
    start: str | None = None,
    end: str | None = None,
    sort: str = "desc",
    offset: int = 0,
    size: int = DEFAULT_SIZE,
    as_of_raw: str | None = None,
) -> EventQuery:
    if sort not in ("asc", "desc"):
        raise InvalidRequest(f'"sort" must be asc or desc, got {sort[:20]!r}')
    if offset < 0 or not 1 <= size <= MAX_SIZE:
        raise InvalidRequest(f'"from" must be 0 or more and "size" 1 to {MAX_SIZE}')
    check_page(offset, size)
    t0, t1 = _time("start", start), _time("end", end)
    if t0 and t1 and t0 > t1:
        raise InvalidRequest('"start" must be before "end"')
    excluded = tuple(x.strip() for x in (exclude or "").split(",") if x.strip())
    return EventQuery(
        (include or "").strip() or None, excluded, t0, t1, sort, offset, size, as_of(as_of_raw)
    )


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


def decode_scroll(token: str, kind: str) -> dict[str, Any]:
    """The state a scrollId carries; refused unless it was made by a list of this kind."""
    try:
        state = json.loads(base64.urlsafe_b64decode(token.encode() + b"=" * (-len(token) % 4)))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise InvalidRequest("scrollId is not valid") from None
    if (
        not isinstance(state, dict)
        or state.get("t") != kind
        or not isinstance(state.get("v"), int)
        or not isinstance(state.get("s"), int)
        or not 1 <= state["s"] <= MAX_SIZE
    ):
        raise InvalidRequest("scrollId is not valid for this list")
    return state


def add_event_filters(q: EventQuery, where: list[str], params: list[Any]) -> None:
    """The events list's filters (include, exclude, start, end) as SQL conditions and their
    parameters, appended in order."""
    if q.include:
        where.append("event_action = ?")
        params.append(q.include)
    if q.exclude:
        where.append("event_action not in (select unnest(?))")
        params.append(list(q.exclude))
    if q.start:
        where.append("event_time > ?")
        params.append(q.start)
    if q.end:
        where.append("event_time < ?")
        params.append(q.end)
