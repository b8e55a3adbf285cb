"""Who may call a tenant path: the `auth-token` header, its scope, and its rate limit."""

from __future__ import annotations

import hashlib

from litestar import Request

from mallard.errors import Forbidden, RateLimited, Unauthenticated
from mallard.ratelimit import RateLimiter
from mallard.tenancy import ControlStore, Scope

TOKEN_HEADER = "auth-token"


def authorize(request: Request, client_id: str, account_id: str, brand_id: str) -> Scope:
    """The caller's scope, after checking it covers this client/account/brand and the rate limit.

    A path naming an unknown tenant is refused exactly like an out-of-scope token, so paths
    cannot be used to probe which tenants exist.
    """
    control: ControlStore = request.app.state.control
    secret = request.headers.get(TOKEN_HEADER)
    if not secret:
        limit_unauthenticated(request)
        raise Unauthenticated(f"missing {TOKEN_HEADER} header")
    scope, tenant_exists = control.access(secret, client_id, account_id, brand_id)
    if scope is None:
        limit_unauthenticated(request)
        raise Unauthenticated(f"invalid {TOKEN_HEADER}")
    if not (tenant_exists and scope.allows(client_id, account_id, brand_id)):
        raise Forbidden(f"token not authorised for {client_id}/{account_id}/{brand_id}")
    limit(request, "token:" + hashlib.sha256(secret.encode()).hexdigest()[:16])
    return scope


def limit_unauthenticated(request: Request) -> None:
    """Calls without a valid token draw on a bucket of their client's address: guessing tokens
    is limited like calling with one, and a valid token's own bucket is not touched."""
    limit(request, "unauthenticated:" + (request.client.host if request.client else ""))


def limit(request: Request, key: str) -> None:
    limiter: RateLimiter = request.app.state.rate_limiter
    wait = limiter.take(key)
    if wait:
        raise RateLimited("rate limit exceeded", headers=RateLimiter.retry_after_header(wait))
