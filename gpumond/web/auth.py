"""Optional read-side authentication for both daemons: HTTP basic auth against bcrypt hashes (exporter-toolkit's
`basic_auth_users`) and/or bearer tokens, as ASGI middleware in front of the daemon's app.

Health paths stay open (probes carry no credentials and learn nothing), and so does the push API, which has
its own bearer tokens. bcrypt is slow on purpose (~50-250 ms a check), so a successful check is remembered
(keyed by a SHA-256 of user and password, never the password) and checks run off the event loop, two at a time:
a scraper pays bcrypt once, and a flood of wrong passwords cannot stall /metrics for the others.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

_REMEMBERED = 256
# A valid bcrypt hash of a random string: an unknown user costs the same time as a wrong password.
_DUMMY = b"$2b$10$3euPcmQFCiblsZeEu5s7p.9OVHgeHWFDk9nhMqZ0m/3pd/lhwZgES"


class ReadAuth:
    """Refuses requests to every path but `open_paths` without valid credentials (401, WWW-Authenticate)."""

    def __init__(self, app: App, *, users: Mapping[str, str], tokens: Iterable[str], open_paths: Iterable[str],
                 realm: str = "gpumond") -> None:
        import bcrypt  # only when basic auth is configured; a hard dependency of the daemons

        self._app = app
        self._users = {u: h.encode() for u, h in users.items()}
        self._tokens = tuple(t.encode() for t in tokens)
        self._open = frozenset(open_paths)
        self._checkpw = bcrypt.checkpw
        self._good: OrderedDict[bytes, None] = OrderedDict()
        self._checks: asyncio.Semaphore | None = None
        schemes = ([f'Basic realm="{realm}"'] if self._users else []) + (["Bearer"] if self._tokens else [])
        self._challenge = ", ".join(schemes).encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self._open or await self._allowed(scope):
            await self._app(scope, receive, send)
            return
        body = b"unauthorized: this endpoint needs credentials (see the daemon's web config file)\n"
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", self._challenge)]})
        await send({"type": "http.response.body", "body": body})

    async def _allowed(self, scope: Scope) -> bool:
        header = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), b"")
        scheme, _, credentials = header.partition(b" ")
        scheme, credentials = scheme.lower(), credentials.strip()
        if scheme == b"bearer" and self._tokens:
            # Every token compared, in constant time each: the answer's timing says nothing about which matched.
            return sum(hmac.compare_digest(credentials, t) for t in self._tokens) > 0
        if scheme == b"basic" and self._users:
            try:
                user, sep, password = base64.b64decode(credentials, validate=True).partition(b":")
            except (binascii.Error, ValueError):
                return False
            return bool(sep) and await self._basic(user, password)
        return False

    async def _basic(self, user: bytes, password: bytes) -> bool:
        hashed = self._users.get(user.decode("utf-8", "replace"))
        key = hashlib.sha256(user + b"\0" + password + b"\0" + (hashed or b"")).digest()
        if hashed is not None and key in self._good:
            self._good.move_to_end(key)
            return True
        if self._checks is None:
            self._checks = asyncio.Semaphore(2)
        async with self._checks:
            ok = await asyncio.get_running_loop().run_in_executor(None, self._check, password, hashed)
        if ok:
            self._good[key] = None
            if len(self._good) > _REMEMBERED:
                self._good.popitem(last=False)
        return ok

    def _check(self, password: bytes, hashed: bytes | None) -> bool:
        try:
            return bool(self._checkpw(password, hashed or _DUMMY)) and hashed is not None
        except ValueError:  # bcrypt refuses passwords over 72 bytes in its newest releases
            return False
