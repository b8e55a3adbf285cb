"""Regulation routes: file a privacy request, follow it, download an Access export.

`POST|GET /track/{clientId}/{accountId}/{BRANDID}/v1/regulations`, `GET .../regulations/{id}`
and `GET .../regulations/{id}/download`. Authenticated like the read API, and account-wide: the
token's scope must cover the whole account (a brand-scoped token gets 403). Filing writes the
regulation and its effect on the collectors' lists (mallard/regulations.py) before it answers,
and starts the regulation's run at once (mallard/regulation_runs.py).

The answers are built here for the HTTP routes and for `mallard regulations show|list` alike.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Annotated, Any, Literal

import anyio.to_thread
import msgspec
from litestar import Controller, MediaType, Request, Response, get, post
from litestar.di import Provide
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import FromPath
from litestar.response import Stream

from api.params import only
from api.schemas import READ_ERRORS as ERRORS
from api.service import Warehouse
from collector.messages import Tenant
from collector.routes import TENANT_PATH, decode_json
from mallard.auth import authorize
from mallard.errors import (
    Forbidden,
    Gone,
    InvalidRequest,
    NotFound,
    ValidationFailed,
    refuse_large_bodies,
)
from mallard.openapi import answers, request_body
from mallard.paths import DataPaths
from mallard.regulation_runs import RegulationRuns
from mallard.regulations import (
    MAX_IDS,
    TYPES,
    Regulation,
    RegulationError,
    RegulationStore,
    validate,
)

log = logging.getLogger(__name__)
# The types whose filing adds the subject to a collector list: the anonymousIds the models tie
# to each userId are looked up and listed with it before the answer.
LISTED = ("SUPPRESS", "SUPPRESS_WITH_DELETE", "NO_TRACK")
LIST_SIZE = 100  # GET regulations: the newest this many
# The one encoding of the answers, for the routes and the CLI alike.
encode = msgspec.json.Encoder().encode


# --- who may call -------------------------------------------------------------------------------


def account_tenant(
    request: Request[Any, Any, Any],
    clientId: str,  # noqa: N803
    accountId: str,  # noqa: N803
    BRANDID: str,  # noqa: N803
) -> Tenant:
    """The tenant of the path, once the auth-token covers it (read API rules) and its scope is
    the whole account: a regulation applies to the account's customers on every brand."""
    scope = authorize(request, clientId, accountId, BRANDID)
    if scope.kind == "brand":
        raise Forbidden(
            f"a regulation applies to the whole account {clientId}/{accountId}: it needs a token"
            " whose scope covers the account (client, account or brands), not one brand"
        )
    return Tenant(clientId, accountId, BRANDID)


ACCOUNT_TENANT = {"tenant": Provide(account_tenant, sync_to_thread=False)}


# --- the answers --------------------------------------------------------------------------------


def iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def download_url(reg: Regulation) -> str:
    """The download's address, relative to the server (the tenant path it was filed on)."""
    return (
        f"/track/{reg.client_id}/{reg.account_id}/{reg.brand_id}/v1/regulations/"
        f"{reg.regulation_id}/download"
    )


def summary(reg: Regulation) -> dict[str, Any]:
    """A regulation as `GET regulations` lists it."""
    return {
        "regulationId": reg.regulation_id,
        "regulationType": reg.regulation_type,
        "status": reg.status,
        "clientId": reg.client_id,
        "accountId": reg.account_id,
        "brandId": reg.brand_id,
        "createdAt": iso(reg.created_at),
        "startedAt": iso(reg.started_at),
        "finishedAt": iso(reg.finished_at),
        "subjectCount": len(reg.subject_hashes),
        "error": reg.error,
    }


def describe(reg: Regulation, hash_of: Callable[[str, str], str]) -> dict[str, Any]:
    """A regulation as `GET regulations/{id}` answers it. Per subject: its userId (null once a
    Delete of it finished: only its hash is kept), the hash, and its outcome (the run keys
    outcomes by the hash). `download` is set for Access once its zip was made."""
    plain = {hash_of(reg.account_id, u): u for u in reg.subject_ids}
    outcome = reg.outcome or {}
    subjects = [
        {
            "type": "USER_ID",
            "id": plain.get(h),
            "idHash": h,
            "outcome": outcome.get(h),
        }
        for h in reg.subject_hashes
    ]
    download = None
    if reg.regulation_type == "ACCESS" and (reg.download_path or reg.download_expires_at):
        download = {
            "url": download_url(reg),
            "expiresAt": iso(reg.download_expires_at),
            "expired": _expired(reg, time.time()),
        }
    return {
        **summary(reg),
        "subjects": subjects,
        "evidence": reg.evidence,
        "download": download,
    }


def _expired(reg: Regulation, now: float) -> bool:
    return reg.download_expires_at is not None and now >= reg.download_expires_at


# --- what the routes and the CLI do -------------------------------------------------------------


def tied_anonymous_ids(
    warehouse: Warehouse, account_id: str, user_ids: list[str]
) -> dict[str, list[str]]:
    """Per userId, the anonymousIds the models tie to it now: the customers the userId names and
    their identifiers, read as `GET profiles/userId:{id}/external_ids` reads them."""
    snap = warehouse.snapshot()
    customers: dict[str, str] = {}
    for user_id in user_ids:
        for customer_id, _ in warehouse.customers_by(snap, account_id, "userId", user_id, "id"):
            customers[customer_id] = user_id
    out: dict[str, list[str]] = {}
    if customers:
        for customer_id, id_type, value, *_ in warehouse.identifiers(snap, list(customers)):
            if id_type == "anonymousId":
                out.setdefault(customers[customer_id], []).append(value)
    return out


def parse_body(body: bytes) -> tuple[str, list[str]]:
    """(regulationType, userIds) of a request body; 400 naming the field at fault."""
    data = decode_json(body)
    try:
        return validate(data)
    except RegulationError as e:
        raise ValidationFailed(_naming(e)) from None


def _naming(e: RegulationError) -> str:
    message = str(e)
    return message if message.startswith(e.field) else f"{e.field}: {message}"


def file_regulation(
    store: RegulationStore,
    warehouse: Warehouse,
    runs: RegulationRuns,
    tenant: Tenant,
    kind: str,
    user_ids: list[str],
) -> Regulation:
    """File a regulation, its collector lists in effect (with the anonymousIds the models tie
    to each userId) when this returns, and start its run."""
    anonymous = tied_anonymous_ids(warehouse, tenant.account_id, user_ids) if kind in LISTED else {}
    try:
        reg = store.file(
            tenant.client_id, tenant.account_id, tenant.brand_id, kind, user_ids, anonymous
        )
    except RegulationError as e:
        raise InvalidRequest(_naming(e)) from None
    try:
        runs.start(reg.regulation_id)
    except OSError:
        # Filed all the same: the next server start (or `mallard regulations resume`) runs it.
        log.exception("regulation %s: run not started", reg.regulation_id)
    return reg


def filed(reg: Regulation) -> dict[str, Any]:
    """The answer to filing a regulation."""
    return {"regulationId": reg.regulation_id, "status": reg.status}


def account_regulation(store: RegulationStore, tenant: Tenant, regulation_id: str) -> Regulation:
    """The regulation, if it is the tenant account's; 404 otherwise (another account's
    regulations are not told apart from ones that do not exist)."""
    reg = store.get(regulation_id)
    if reg is None or (reg.client_id, reg.account_id) != (tenant.client_id, tenant.account_id):
        raise NotFound(f"no regulation {regulation_id}")
    return reg


def download_file(reg: Regulation, paths: DataPaths, now: float | None = None) -> Path:
    """The Access zip of a regulation: 404 while there is none yet (or for another type), 410
    once the zip existed and is gone (a Delete of its subject removed it, or the download
    expired), with the reason."""
    rid = reg.regulation_id
    if reg.regulation_type != "ACCESS":
        raise NotFound(f"regulation {rid} is {reg.regulation_type}: only ACCESS has a download")
    removed = (reg.evidence or {}).get("downloadRemoved")
    if reg.download_path is None and isinstance(removed, dict):
        raise Gone(
            f"the download of regulation {rid} was removed at {removed.get('at')} by regulation"
            f" {removed.get('by')}, a Delete of its subject"
        )
    if _expired(reg, time.time() if now is None else now):
        raise Gone(f"the download of regulation {rid} expired at {iso(reg.download_expires_at)}")
    if reg.download_path is None:
        if reg.download_expires_at is not None:
            raise Gone(f"the download of regulation {rid} was removed")
        raise NotFound(f"regulation {rid} has no download yet (status {reg.status})")
    path = Path(reg.download_path)
    path = (path if path.is_absolute() else paths.root / path).resolve()
    if not path.is_relative_to(paths.root.resolve()) or not path.is_file():
        raise Gone(f"the download of regulation {rid} was removed")
    return path


# --- the routes ---------------------------------------------------------------------------------


class RegulationSubject(msgspec.Struct):
    """Whom the regulation is about: userIds of the account."""

    type: Literal["USER_ID"]
    ids: Annotated[list[str], msgspec.Meta(min_length=1, max_length=MAX_IDS)]


class RegulationRequest(msgspec.Struct):
    """A privacy request about users of the account, by userId."""

    regulationType: Literal[TYPES]  # type: ignore[valid-type]  # noqa: N815
    subject: RegulationSubject


class RegulationFiled(msgspec.Struct):
    regulationId: str  # noqa: N815
    status: Literal["pending", "running", "finished", "failed"]


class SubjectOutcome(msgspec.Struct):
    type: Literal["USER_ID"]
    id: Annotated[str | None, msgspec.Meta(description="null once a Delete of it finished")]
    idHash: str  # noqa: N815
    outcome: Annotated[
        Any,
        msgspec.Meta(description="What the run did for this userId; null until it did it"),
    ]


class Download(msgspec.Struct):
    url: str
    expiresAt: str | None  # noqa: N815
    expired: bool


class RegulationSummary(msgspec.Struct):
    regulationId: str  # noqa: N815
    regulationType: Literal[TYPES]  # type: ignore[valid-type]  # noqa: N815
    status: Literal["pending", "running", "finished", "failed"]
    clientId: str  # noqa: N815
    accountId: str  # noqa: N815
    brandId: str  # noqa: N815
    createdAt: str  # noqa: N815
    startedAt: str | None  # noqa: N815
    finishedAt: str | None  # noqa: N815
    subjectCount: int  # noqa: N815
    error: str | None


class RegulationList(msgspec.Struct):
    data: list[RegulationSummary]


class RegulationDetail(RegulationSummary):
    subjects: list[SubjectOutcome]
    evidence: Annotated[
        dict[str, Any] | None,
        msgspec.Meta(
            description="What the run did and found: rows deleted per table, files rewritten,"
            " snapshots expired, rows and bytes still found (0)"
        ),
    ]
    download: Download | None


_EXAMPLES = {
    "suppress and delete": {
        "regulationType": "SUPPRESS_WITH_DELETE",
        "subject": {"type": "USER_ID", "ids": ["u-42"]},
    },
    "access": {"regulationType": "ACCESS", "subject": {"type": "USER_ID", "ids": ["u-42"]}},
}
_BAD_BODY = (
    "validation_error (a bad regulationType, subject, subject.type or subject.ids, named in the"
    " message) or invalid_request_error (not JSON; DELETE of a userId not suppressed)",
    "subject.ids[3]: each userId must be a non-empty string of at most 1024 characters",
)
_FORBIDDEN = (
    "authentication_error: token not authorised for this account, or scoped to a brand",
    "a regulation applies to the whole account demo/demo: it needs a token whose scope covers"
    " the account (client, account or brands), not one brand",
)
_NOT_FOUND = ("not_found: no such regulation in this account", "no regulation r-404")
_GONE = (
    "not_found: the download expired or its zip was removed",
    "the download of regulation 01a2... expired at 2026-03-08T10:00:00.000Z",
)
_COMMON = {s: e for s, e in ERRORS.items() if s not in (400, 403, 404)} | {403: _FORBIDDEN}


def _documented(ok: Any, description: str, **errors: tuple[str, str]) -> dict[int, ResponseSpec]:
    codes = {"bad": 400, "not_found": 404, "gone": 410}
    extra = {codes[k]: v for k, v in errors.items()}
    return answers(ok, description, dict(sorted((_COMMON | extra).items())), "read")


def _store(request: Request[Any, Any, Any]) -> RegulationStore:
    store: RegulationStore = request.app.state.regulations
    return store


def _json(body: Any) -> Response[bytes]:
    return Response(encode(body), media_type=MediaType.JSON, headers={"cache-control": "no-store"})


def _chunks(f: IO[bytes]) -> Iterator[bytes]:
    try:
        while chunk := f.read(1 << 20):
            yield chunk
    finally:
        f.close()


class Regulations(Controller):
    """Privacy requests of the account in the path."""

    path = TENANT_PATH + "/regulations"
    dependencies = ACCOUNT_TENANT
    before_request = refuse_large_bodies  # type: ignore[assignment]
    tags = ["Regulations"]
    security = [{"authToken": []}]

    @post(
        "/",
        operation_id="fileRegulation",
        status_code=200,
        summary="File a regulation (privacy request)",
        description="Body {regulationType, subject: {type: USER_ID, ids: [1 to 5,000 userIds]}}."
        " Suppression and NoTrack hold from this answer on, for the userIds and the"
        " anonymousIds the models tie to them; the regulation runs at once. DELETE needs every"
        " userId under an active suppression.",
        dependencies=request_body(
            RegulationRequest, "The regulation type and its subject's userIds.", _EXAMPLES
        ),
        responses=_documented(RegulationFiled, "Filed: {regulationId, status}", bad=_BAD_BODY),
    )
    async def file(self, request: Request[Any, Any, Any], tenant: Tenant) -> Response[bytes]:
        only(request, frozenset())
        kind, user_ids = parse_body(await request.body())
        state = request.app.state
        reg = await anyio.to_thread.run_sync(
            file_regulation,
            state.regulations,
            state.warehouse,
            state.regulation_runs,
            tenant,
            kind,
            user_ids,
        )
        return _json(filed(reg))

    @get(
        "/",
        operation_id="listRegulations",
        sync_to_thread=True,
        summary="The account's regulations, newest first",
        description=f"The newest {LIST_SIZE}; each one's subjects and evidence are in"
        " GET regulations/{regulationId}.",
        responses=_documented(RegulationList, "{data: [regulation]}", bad=ERRORS[400]),
    )
    def list_regulations(self, request: Request[Any, Any, Any], tenant: Tenant) -> Response[bytes]:
        only(request, frozenset())
        regs = _store(request).list(tenant.client_id, tenant.account_id, LIST_SIZE)
        return _json({"data": [summary(r) for r in regs]})

    @get(
        "/{regulationId:str}",
        operation_id="getRegulation",
        sync_to_thread=True,
        summary="A regulation: status, per-subject outcome, evidence, Access download",
        description="status is pending, running, finished or failed (then error says why).",
        responses=_documented(
            RegulationDetail, "The regulation", bad=ERRORS[400], not_found=_NOT_FOUND
        ),
    )
    def get_regulation(
        self,
        request: Request[Any, Any, Any],
        tenant: Tenant,
        regulationId: FromPath[str],  # noqa: N803
    ) -> Response[bytes]:
        only(request, frozenset())
        store = _store(request)
        return _json(describe(account_regulation(store, tenant, regulationId), store.hash))

    @get(
        "/{regulationId:str}/download",
        operation_id="downloadRegulation",
        sync_to_thread=True,
        summary="The zip of an ACCESS regulation",
        description="404 until the zip is made; 410 once the download expired.",
        responses=_documented(
            bytes, "The Access zip", bad=ERRORS[400], not_found=_NOT_FOUND, gone=_GONE
        )
        | {200: ResponseSpec(bytes, False, "The Access zip", "application/zip")},
    )
    def download(
        self,
        request: Request[Any, Any, Any],
        tenant: Tenant,
        regulationId: FromPath[str],  # noqa: N803
    ) -> Stream:
        only(request, frozenset())
        reg = account_regulation(_store(request), tenant, regulationId)
        path = download_file(reg, request.app.state.paths)
        # Opened here: a zip removed from now on is still sent whole, from this descriptor.
        try:
            f = open(path, "rb")  # noqa: SIM115 - closed by _chunks
        except FileNotFoundError:
            raise Gone(f"the download of regulation {regulationId} was removed") from None
        return Stream(
            _chunks(f),
            media_type="application/zip",
            headers={
                "content-length": str(os.fstat(f.fileno()).st_size),
                "content-disposition": f'attachment; filename="access-{regulationId}.zip"',
                "cache-control": "no-store",
            },
        )


ROUTES = [Regulations]
