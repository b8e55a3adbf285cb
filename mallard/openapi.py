"""What the OpenAPI document declares beyond the handlers' signatures: bodies and error answers.

Handlers read the raw body and decode it once with msgspec (collector/routes.py), so a request
body is declared for the document only, as the `data` of a dependency no handler names: Litestar
documents the `data` of a route's dependencies as its request body, and resolves only the
dependencies a handler's signature asks for, so the declaration never runs on a request.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from litestar.di import Provide
from litestar.handlers import HTTPRouteHandler
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import Example, Operation, RequestBody, Schema
from litestar.params import Body
from litestar.types import Method, OperationIDCreator

from mallard.errors import ErrorBody, Family, IngestErrorBody

# The key no handler names: a handler asking for it would decode the body a second time.
DOCUMENTED_BODY = "documented_body"


def request_body(shape: Any, description: str, examples: Mapping[str, Any]) -> dict[str, Provide]:
    """A route's `dependencies` that document `shape` as its JSON body, with named examples."""

    def documented_body(data: Any) -> None:
        raise AssertionError("a documented body is never resolved")  # pragma: no cover

    named = [Example(summary=name, value=value) for name, value in examples.items()]
    documented_body.__annotations__ = {
        "data": Annotated[shape, Body(description=description, examples=named)],
        "return": None,
    }
    return {DOCUMENTED_BODY: Provide(documented_body, sync_to_thread=False)}


def answers(
    ok: Any,
    description: str,
    errors: Mapping[int, tuple[str, str]],
    family: Family,
    example: Any = None,
) -> dict[int, ResponseSpec]:
    """The documented answers of a route: its success body and each error status, with the
    error body of its family (mallard.errors.error_body) and an example message per status.

    errors maps a status to (what it means, an example message); on the read family the meaning
    starts with the error code.
    """
    out = {
        200: ResponseSpec(
            data_container=ok,
            description=description,
            generate_examples=False,
            examples=None if example is None else [Example(summary="success", value=example)],
        )
    }
    for status, (meaning, message) in errors.items():
        if family == "ingest":
            body: Any = IngestErrorBody
            value: dict[str, Any] = {"success": False, "message": message}
        else:
            # A read error's meaning starts with its code (mallard.errors).
            body, code = ErrorBody, meaning.split()[0].rstrip(":,")
            value = {"error": {"code": code, "message": message}}
        out[status] = ResponseSpec(
            data_container=body,
            description=meaning,
            generate_examples=False,
            examples=[Example(summary=str(status), value=value)],
        )
    return out


@dataclass
class NoValidationError(Operation):
    """The operation of a route that never answers 400: Litestar documents its own validation
    error (400) for every route with a parameter or a body, but these take only strings from the
    path and their documented body is never validated by Litestar."""

    def __post_init__(self) -> None:
        if self.responses:
            self.responses.pop("400", None)


@dataclass
class OneOfTheBodies(Operation):
    """The operation of a route whose body is one of several shapes, chosen by the path (the
    action) rather than by the body: documented as anyOf, where Litestar writes a union as oneOf,
    since one body may fit several shapes (a screen call without `event` fits track's too, once
    it names an event)."""

    def __post_init__(self) -> None:
        body = self.request_body
        if not isinstance(body, RequestBody):
            return
        for media in (body.content or {}).values():
            schema = media.schema
            if isinstance(schema, Schema) and schema.one_of:
                schema.any_of, schema.one_of = schema.one_of, None


def operation_id_per_path(prefix: str) -> OperationIDCreator:
    """An OpenAPI operation id per path of a handler that serves several (ids must be unique)."""

    def create(handler: HTTPRouteHandler, method: Method, components: list[Any]) -> str:
        return prefix + str(components[-1]).title()

    return create
