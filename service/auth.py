"""The admin token: ``Authorization: Bearer <CALIB_ADMIN_TOKEN>`` (RFC 6750; the scheme is matched
case-insensitively, as RFC 7235 says)."""

from __future__ import annotations

import secrets

from pydantic import SecretStr
from starlette.requests import HTTPConnection

from service.errors import Forbidden, Unauthorized


def is_admin(request: HTTPConnection, token: SecretStr | None) -> bool:
    """Whether the request carries the admin ``token`` (False when admin endpoints are disabled)."""
    scheme, _, credentials = request.headers.get("authorization", "").strip().partition(" ")
    return (token is not None and scheme.lower() == "bearer"
            and secrets.compare_digest(credentials.strip().encode(), token.get_secret_value().encode()))


def authorize(request: HTTPConnection, token: SecretStr | None) -> None:
    """Raise 403 when admin endpoints are disabled, 401 without the token; checked before anything else."""
    if token is None:
        raise Forbidden("admin endpoints are disabled: set CALIB_ADMIN_TOKEN")
    if not is_admin(request, token):
        raise Unauthorized("a valid 'Authorization: Bearer <admin token>' header is required")
