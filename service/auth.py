"""Who may call what: named bearer tokens (RFC 6750) per route group, ``predict``, ``feedback`` or ``admin``.

A group without tokens is open, but admin is then disabled (403). Tokens come from ``CALIB_AUTH__<GROUP>_TOKENS`` or
the file ``..._TOKENS_FILE`` names, re-read when it changes; compared in constant time and never logged or shown.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import SecretStr

from service.errors import Forbidden, Unauthorized
from service.settings import GROUPS, Group, Settings
from service.settings_env import parse_tokens
from service.store.rows import ANONYMOUS

log = logging.getLogger("service.auth")

Access = Literal["predict", "feedback", "admin", "open"]
#: Who may call a route or a gRPC method: the holders of a token of its group, or anyone.
ACCESS: tuple[Access, ...] = (*GROUPS, "open")
REALM = 'Bearer realm="calibrated-serving"'


@dataclass
class _File:
    path: Path
    stamp: tuple[int, int] | None = None  # (mtime_ns, size) when last read
    tokens: dict[str, bytes] = field(default_factory=dict)


class AccessControl:
    """The tokens of every group; ``check`` is what the HTTP middleware and the gRPC methods call."""

    def __init__(self, settings: Settings) -> None:
        self._files: dict[str, _File] = {}
        self._tokens: dict[str, dict[str, bytes]] = {}  # per group: the inline tokens, or the file's
        for group in GROUPS:
            value: SecretStr | None = getattr(settings.auth, f"{group}_tokens")
            name = f"CALIB_AUTH__{group.upper()}_TOKENS"
            self._tokens[group] = parse_tokens(value.get_secret_value(), name) if value else {}
            path = getattr(settings.auth, f"{group}_tokens_file")
            if path is not None:
                self._files[group] = _File(Path(path))
        self.reload(strict=True)

    @property
    def watches_files(self) -> bool:
        """Whether any group's tokens come from a file, which ``reload`` re-reads."""
        return bool(self._files)

    def reload(self, strict: bool = False) -> bool:
        """Re-read the token files that changed; whether any did. A file that cannot be read keeps its previous
        tokens, or stops the start when ``strict``."""
        changed = False
        for group, file in self._files.items():
            try:
                stat = file.path.stat()
                stamp = (stat.st_mtime_ns, stat.st_size)
                if stamp == file.stamp:
                    continue
                file.tokens = parse_tokens(file.path.read_text(), f"CALIB_AUTH__{group.upper()}_TOKENS_FILE")
                file.stamp, changed = stamp, True
                self._tokens[group] = file.tokens
                log.info("%s tokens read from %s: %d", group, file.path, len(file.tokens))
            except (OSError, ValueError, UnicodeDecodeError) as exc:
                if strict:
                    raise ValueError(f"CALIB_AUTH__{group.upper()}_TOKENS_FILE: {exc}") from None
                log.error("%s tokens: %s; the previous ones stay valid", group, exc)
        return changed

    def required(self, group: Group) -> bool:
        """Whether requests of ``group`` must carry a token (admin always does)."""
        return group == "admin" or bool(self._tokens[group])

    def check(self, group: Group, authorization: str | None) -> str:
        """The name of the token ``authorization`` carries for ``group`` (``anonymous`` where it is open); 401 without
        a valid one, 403 for admin routes when no admin token is set."""
        tokens = self._tokens[group]
        if not tokens:
            if group == "admin":
                raise Forbidden(
                    "admin endpoints are disabled: set CALIB_AUTH__ADMIN_TOKENS or CALIB_AUTH__ADMIN_TOKENS_FILE"
                )
            return ANONYMOUS
        scheme, _, credentials = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not credentials.strip():
            raise Unauthorized(f"a valid 'Authorization: Bearer <token>' header is required ({group} routes)", REALM)
        given, found = credentials.strip().encode(), None
        for name, token in tokens.items():  # every token is compared: the time does not tell which matched
            if secrets.compare_digest(given, token):
                found = name
        if found is None:
            raise Unauthorized(f"the bearer token is not valid for {group} routes", f'{REALM}, error="invalid_token"')
        return found

    def allows(self, group: Group, authorization: str | None) -> bool:
        """Whether ``authorization`` holds a token of ``group`` (a required one: open groups say False)."""
        try:
            return self.check(group, authorization) != ANONYMOUS
        except (Unauthorized, Forbidden):
            return False
