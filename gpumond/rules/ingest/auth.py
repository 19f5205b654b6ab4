"""Bearer-token authentication of pushes: constant-time, and silent about which token matched or why."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass

ANONYMOUS = "anonymous"


@dataclass(frozen=True, slots=True)
class AuthResult:
    """Who a request is (`identity`, never the token itself), or why it was refused (`problem`)."""

    identity: str | None
    problem: str = ""
    missing: bool = False  # no credentials at all, as opposed to wrong ones (RFC 6750 error code)


class TokenAuth:
    """Checks `Authorization: Bearer <token>` against the configured tokens."""

    def __init__(self, tokens: Sequence[str], allow_unauthenticated: bool = False) -> None:
        # Compare SHA-256 digests, not the tokens: equal lengths, so compare_digest's time
        # does not depend on how long the configured tokens are either.
        self._digests = tuple(_digest(t.encode()) for t in tokens)
        self._open = allow_unauthenticated

    def __repr__(self) -> str:
        return f"TokenAuth({len(self._digests)} tokens, allow_unauthenticated={self._open})"

    def check(self, authorization: str | None) -> AuthResult:
        """Identify the caller from the Authorization header value (None when absent)."""
        if authorization is None or not authorization.strip():
            if self._open:
                return AuthResult(ANONYMOUS)
            return AuthResult(None, "missing bearer token: send 'Authorization: Bearer <token>'", missing=True)
        scheme, _, credentials = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not credentials.strip():
            return AuthResult(None, "Authorization must be 'Bearer <token>'")
        given = _digest(credentials.strip().encode("utf-8", "surrogateescape"))
        match = -1
        # Every token is compared, whatever matched, so the time taken does not say which one did.
        for i, digest in enumerate(self._digests):
            if hmac.compare_digest(given, digest):
                match = i
        if match < 0:
            return AuthResult(None, "invalid bearer token")
        return AuthResult(f"token#{match}")


def _digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()
