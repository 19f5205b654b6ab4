"""POST one push body to the rules service over a reused keep-alive connection (http.client)."""

from __future__ import annotations

import http.client
import json
import logging
import ssl
import time
import urllib.parse
from dataclasses import dataclass
from collections.abc import Callable, Mapping
from typing import NoReturn, Protocol

from gpumond import __version__
from gpumond.job.settings import ConfigError
from gpumond.wire.media import EARLY_HEADER, JSON_TYPE
from gpumond.wire.retry import parse_retry_after
from gpumond.wire.tlsclient import ClientTLS, explain, https_instead

log = logging.getLogger("gpumond.job")

PUSH_PATH = "/api/v1/push"
_MAX_REPLY_BYTES = 64 * 1024  # the service answers in a few bytes; more is not worth reading
# What a kept-alive socket the server closed while idle raises on reuse; worth one immediate retry.
_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


@dataclass(frozen=True, slots=True)
class Reply:
    """What the service answered: status, its Retry-After in seconds, and the start of the body."""

    status: int
    retry_after_s: float | None = None
    detail: str = ""
    # On a 2xx: the steps the service did not store, by its reason ({"dropped": {"stale": 5}} in the body).
    dropped: tuple[tuple[str, int], ...] = ()


class Transport(Protocol):
    """Sends one push; raises OSError or http.client.HTTPException when there was no answer.

    `early`: the push is made at once after a step that stood out (gpumond/job/early.py); a node relay forwards
    such a push at once, the rules service takes it as any other."""

    def post(self, body: bytes, timeout_s: float, *, early: bool = False) -> Reply: ...

    def close(self) -> None: ...


class TLSError(OSError):
    """The TLS handshake with the rules service failed; the message says what to fix."""


class HttpTransport:
    """`POST <endpoint>/api/v1/push` with a bearer token, one connection kept open between pushes.

    Over https the server is verified with `tls` (the system CA bundle when None). `to_relay`: the endpoint is a
    node relay, which is told which pushes are early (EARLY_HEADER); the rules service never is."""

    def __init__(self, endpoint: str, token: str | None, tls: ClientTLS | None = None,
                 content_type: str = JSON_TYPE, headers: Mapping[str, str] | None = None,
                 setting: tuple[str, str] = ("the rules service", "GPUMOND_ENDPOINT"), *,
                 to_relay: bool = False) -> None:
        url = urllib.parse.urlsplit(endpoint)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ConfigError(f"endpoint must be an http:// or https:// URL with a host (got {endpoint!r})")
        try:
            self._port = url.port
        except ValueError:
            raise ConfigError(f"endpoint has a bad port (got {endpoint!r})") from None
        self._https = url.scheme == "https"
        if tls is not None and not self._https:
            raise ConfigError(f"a CA file or client certificate is set but the endpoint is not https:// (got "
                              f"{endpoint!r})")
        try:
            self._tls = tls if tls is not None or not self._https else ClientTLS()
        except ValueError as e:
            raise ConfigError(str(e)) from None
        self._host = url.hostname
        self._endpoint = endpoint
        self._setting = setting  # (what serves `endpoint`, the setting that names it), for the https hint
        self.path = url.path.rstrip("/") + PUSH_PATH
        self._headers = {
            "Content-Type": content_type,  # the push encoding's (gpumond.wire.media.CONTENT_TYPES)
            "User-Agent": f"gpumond-job/{__version__}",
        }
        if token is not None:  # None: to a node relay that pushes under its own node credential
            self._headers["Authorization"] = f"Bearer {token}"
        self._headers.update(headers or {})
        self._early_headers = {**self._headers, EARLY_HEADER: "1"} if to_relay else self._headers
        self._conn: http.client.HTTPConnection | None = None
        self.connections = 0  # opened so far; keep-alive keeps this at 1 on a healthy link

    def post(self, body: bytes, timeout_s: float, *, early: bool = False) -> Reply:
        """Send one body; retry once at once when a kept-alive socket turns out to be closed."""
        headers = self._early_headers if early else self._headers
        reused = self._conn is not None and self._conn.sock is not None
        try:
            return self._exchange(body, timeout_s, headers)
        except _STALE as e:
            self.close()
            if not reused:
                self._unanswered(e)
        except http.client.BadStatusLine as e:
            self._unanswered(e)
        except ssl.SSLError as e:
            raise TLSError(explain(e) or str(e)) from e
        try:
            return self._exchange(body, timeout_s, headers)
        except http.client.BadStatusLine as e:  # RemoteDisconnected too: a fresh connection closed unanswered
            self._unanswered(e)
        except ssl.SSLError as e:
            raise TLSError(explain(e) or str(e)) from e

    def _unanswered(self, exc: BaseException) -> NoReturn:
        """Raise `exc`, saying what to set when it is what a rules service serving TLS does to a plain-HTTP push."""
        https = https_instead(exc, self._endpoint)
        if https is None:
            raise exc
        server, setting = self._setting
        raise type(exc)(f"{exc} (if {server} serves TLS, use {https} in {setting})") from exc

    def _exchange(self, body: bytes, timeout_s: float, headers: Mapping[str, str]) -> Reply:
        conn = self._connection(timeout_s)
        try:
            conn.request("POST", self.path, body=body, headers=headers)
            resp = conn.getresponse()
            # Read the answer, even an error page: a connection is reusable only once its body is consumed.
            raw = resp.read(_MAX_REPLY_BYTES)
            detail = _message(raw)
            retry_after = parse_retry_after(resp.getheader("Retry-After"), time.time())
            if resp.will_close or not resp.isclosed():
                self.close()  # the server is closing, or sent more than we will read
            return Reply(resp.status, retry_after, detail, _dropped(raw) if 200 <= resp.status < 300 else ())
        except BaseException:
            self.close()  # half a request leaves the connection in an unknown state
            raise

    def _connection(self, timeout_s: float) -> http.client.HTTPConnection:
        if self._conn is None:
            if self._tls is not None:
                problem = self._tls.refresh()  # a rotated client certificate is used from the next connection
                if problem:
                    log.warning("gpumond: the changed TLS files cannot be used; keeping the previous ones: %s",
                                problem)
                self._conn = http.client.HTTPSConnection(self._host, self._port, timeout=timeout_s,
                                                         context=self._tls.context)
            else:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout_s)
            self.connections += 1
        else:
            self._conn.timeout = timeout_s  # used by the next connect
            if self._conn.sock is not None:
                self._conn.sock.settimeout(timeout_s)
        return self._conn

    def close(self) -> None:
        """Drop the connection; the next post opens a new one."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def _dropped(body: bytes) -> tuple[tuple[str, int], ...]:
    """`{"dropped": {reason: count}}` of a 202, as pairs; anything malformed counts as nothing said."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return ()
    dropped = parsed.get("dropped") if isinstance(parsed, dict) else None
    if not isinstance(dropped, dict):
        return ()
    return tuple((str(k)[:64], v) for k, v in dropped.items()
                 if isinstance(v, int) and not isinstance(v, bool) and v > 0)


def _message(body: bytes) -> str:
    """The service's one-line reason from an error body ({"error": …}), else the start of the raw text."""
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        for key in ("error", "detail"):
            if isinstance(parsed.get(key), str):
                return parsed[key][:200]
    return body[:200].decode("utf-8", "replace")


# While the node relay does not answer, pushes go to the rules service directly; the relay is tried again after
# this long (on loopback a refused connection costs microseconds; the chart's host address at most one timeout).
RELAY_RETRY_S = 30.0
# A relay serves POST /api/v1/push under its address and answers it with anything but these: a server answering them
# is something else on the port (the default 9482 is tried on every node) or a GPUMOND_RELAY with a wrong path.
NOT_A_RELAY = (404, 405)


class RelayTransport:
    """Pushes to the node relay; while no relay answers, to the rules service directly (when there is one to
    reach and the push is complete without the relay), and back to the relay once it answers again."""

    def __init__(self, relay: Transport, direct: Transport | None, clock: Callable[[], float], *,
                 relay_url: str, direct_url: str | None, direct_problem: str | None = None,
                 named: bool = True) -> None:
        self._relay = relay
        self._direct = direct if direct_problem is None else None
        self._clock = clock
        self._relay_url, self._direct_url = relay_url, direct_url
        self._problem = direct_problem
        self._retry_relay_at = float("-inf")
        self.via_relay = True  # where the last push went (the reporter's stats show it)
        # The loopback default on a node without an agent is the usual direct setup: said at info, not as a problem.
        self._level = logging.WARNING if named else logging.INFO

    def post(self, body: bytes, timeout_s: float, *, early: bool = False) -> Reply:
        """Send one body to the relay, else directly; raises as HttpTransport does when neither answers. Only the
        relay hears that a push is early: directly, the push goes as soon as it is made anyway."""
        if self._direct is None or self._clock() >= self._retry_relay_at:
            try:
                reply = self._relay.post(body, timeout_s, early=early)
            except (OSError, http.client.HTTPException) as exc:
                if self._direct is None:
                    if self.via_relay:
                        log.warning("gpumond: no node relay answers at %s (%s) and %s; retrying the relay with backoff",
                                    self._relay_url, exc, self._problem or "no GPUMOND_ENDPOINT is set")
                    self.via_relay = False
                    raise
                # A certificate the rank cannot verify is a mistake to fix, said as a warning; the rules service,
                # verified on its own, still takes the steps meanwhile.
                self._leave_relay(str(exc), logging.WARNING if isinstance(exc, TLSError) else self._level)
            else:
                if reply.status not in NOT_A_RELAY or self._direct is None:
                    if not self.via_relay:
                        log.info("gpumond: the node relay at %s answers again; pushing through it", self._relay_url)
                    self.via_relay = True
                    return reply
                self._leave_relay(f"HTTP {reply.status} {reply.detail[:100]}: not a gpumond relay", logging.WARNING)
        assert self._direct is not None
        return self._direct.post(body, timeout_s)

    def _leave_relay(self, why: str, level: int) -> None:
        """Push directly until RELAY_RETRY_S has passed; said once per stretch without the relay."""
        self._retry_relay_at = self._clock() + RELAY_RETRY_S
        if self.via_relay:
            log.log(level, "gpumond: no node relay answers at %s (%s); pushing to %s directly, and trying the relay "
                    "again every %g s", self._relay_url, why, self._direct_url, RELAY_RETRY_S)
        self.via_relay = False

    def close(self) -> None:
        """Drop both connections."""
        self._relay.close()
        if self._direct is not None:
            self._direct.close()
