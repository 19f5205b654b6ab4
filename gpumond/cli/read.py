"""What the read commands (`gpumond findings`, `gpumond alerts`) share: their TLS and credential flags, base URLs,
one JSON GET of a daemon's read API, and aligned tables.

Stdlib only, so both commands start fast and load nothing of the daemons.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import sys
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpumond.cli.common import EXIT_USAGE
from gpumond.wire.tlsclient import ClientTLS, explain, https_instead
from gpumond.wire.safetext import escape_unsafe

# An answer bigger than this is not a findings or alerts list a terminal can use.
MAX_ANSWER_BYTES = 64 * 1024 * 1024
# Where each daemon listens by default on this machine: the read commands' default --url.
AGENT_URL = "http://127.0.0.1:9480"
RULES_URL = "http://127.0.0.1:9481"


@dataclass(frozen=True)
class Access:
    """How to reach a daemon's read API: the TLS context (--ca-file, --cert-file) and the Authorization header
    (--username/--password-file or --token-file) its web config asks for; the default is plain and anonymous."""

    context: ssl.SSLContext | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def open(self, url: str, timeout_s: float) -> Any:
        request = urllib.request.Request(url, headers=dict(self.headers))
        return urllib.request.urlopen(request, timeout=timeout_s, context=self.context)  # noqa: S310 - http(s)


ANONYMOUS = Access()
# What a 401 from a daemon with read authentication (basic_auth_users / bearer tokens) asks for: credentials,
# or, when some were sent, other ones (telling a refused password from a missing one saves a wrong search).
_CREDENTIALS_HINT = (" (this daemon requires read credentials: --username with --password-file, or --token-file)")
_REFUSED_HINT = (" (this daemon refused the credentials given: check the user name, the first line of "
                 "--password-file or --token-file, and the daemon's basic_auth_users / bearer_tokens_file)")

# What an operator types when they forget the scheme: a host name or address, maybe a port.
_BARE_HOST = re.compile(r"(?:[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\])(?::(\d+))?/?")


class FetchError(RuntimeError):
    """A daemon could not be asked; the message says where, why and what to do."""


def base_url(text: str, default_port: int) -> str:
    """`text` checked as a daemon's base URL (http or https, a host); ValueError says what to type instead."""
    text = text.strip()
    if "://" not in text:
        bare = _BARE_HOST.fullmatch(text)
        if bare:
            hostport = text.rstrip("/") + ("" if bare.group(1) else f":{default_port}")
            raise ValueError(f"{text}: missing scheme; use http://{hostport}")
        raise ValueError(f"{text!r} is not an http:// or https:// URL; e.g. http://127.0.0.1:{default_port}")
    parts = urllib.parse.urlsplit(text)
    if parts.scheme.lower() not in ("http", "https"):
        raise ValueError(f"{text}: scheme {parts.scheme!r} is not supported; use http:// or https://")
    if not parts.hostname:
        raise ValueError(f"{text}: no host; e.g. http://127.0.0.1:{default_port}")
    if any(c.isspace() for c in text):
        raise ValueError(f"{text!r}: a URL cannot contain spaces")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        raise ValueError(f"{text}: the port must be a number from 1 to 65535")
    if parts.query or parts.fragment:
        raise ValueError(f"{text}: give the base URL only, without '?' or '#'")
    return text.rstrip("/")


def get_json(base: str, path: str, key: str, *, daemon: str, query: Mapping[str, str | None] | None = None,
             timeout_s: float = 5.0, access: Access = ANONYMOUS) -> list[dict[str, Any]]:
    """GET {base}{path}?{query} and return the list under `key`; raises FetchError with one line.

    `daemon` names what should answer there (for the hint), e.g. "the rules service (`gpumond rules`)";
    `access` verifies an https daemon, presents a client certificate and the read credentials.
    """
    encoded = urllib.parse.urlencode({k: v for k, v in (query or {}).items() if v})
    full = base.rstrip("/") + path + (f"?{encoded}" if encoded else "")
    try:
        with access.open(full, timeout_s) as resp:
            raw = resp.read(MAX_ANSWER_BYTES + 1)
    except urllib.error.HTTPError as e:
        raise FetchError(f"{full}: HTTP {e.code} {e.reason}{_error_detail(e)}"
                         + (f" (is {daemon} at {base}, in a version that serves {path}? check --url)"
                            if e.code == 404 else _credentials_hint(access) if e.code == 401 else "")) from None
    except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
        reason = getattr(e, "reason", None) or e or type(e).__name__
        # a handshake failure arrives inside URLError; a refusal read after it (TLS 1.3) as the SSLError itself
        tls = explain(e) or (explain(reason) if isinstance(reason, BaseException) else None)
        if tls is not None:
            raise FetchError(f"cannot reach {full}: {tls.replace('GPUMOND_CA_FILE for the job SDK', '--ca-file')}"
                             ) from None
        if (https := https_instead(e, base)) is not None:
            raise FetchError(f"cannot reach {full}: {reason} (if it serves TLS, use {https}; "
                             f"else is {daemon} running there?)") from None
        raise FetchError(f"cannot reach {full}: {reason} (is {daemon} running there? set --url)") from None
    except ValueError as e:  # a URL urllib still refuses (base_url() catches the usual mistakes first)
        raise FetchError(f"{full}: {e}") from None
    if len(raw) > MAX_ANSWER_BYTES:
        raise FetchError(f"{full}: the answer is larger than {MAX_ANSWER_BYTES // 1_048_576} MiB; narrow it down "
                         "with the filter flags")
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):  # JSONDecodeError, bytes that are not text, nesting past the parser's depth
        raise FetchError(f"{full}: the answer is not JSON (is {daemon} serving at {base}?)") from None
    items = body.get(key) if isinstance(body, dict) else None
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise FetchError(f"{full}: the answer has no {key!r} list of objects (is {daemon} serving at {base}?)")
    return items


def _credentials_hint(access: Access) -> str:
    return _REFUSED_HINT if any(k.lower() == "authorization" for k in access.headers) else _CREDENTIALS_HINT


def _error_detail(err: urllib.error.HTTPError) -> str:
    """': <message>' from a gpumond error body {"error": "..."}, else nothing."""
    try:
        body = json.loads(err.read(4096))
    except (ValueError, OSError, http.client.HTTPException):
        return ""
    message = body.get("error") if isinstance(body, dict) else None
    return f": {message[:200]}" if isinstance(message, str) and message else ""


def number(value: Any) -> float | None:
    """A JSON number as a float; None for anything else (a bool is not a number here)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def render(columns: Sequence[str], rows: Sequence[Sequence[str]], empty: str) -> str:
    """Rows as left-aligned text columns under `columns`, or `empty` when there are none."""
    if not rows:
        return empty
    # A cell holds what a daemon answered (job and node names pushed by jobs): escape what could split a
    # row or reorder it on screen (gpumond.wire.safetext), before measuring widths.
    every = [tuple(columns), *([escape_unsafe(c) for c in r] for r in rows)]
    widths = [max(len(r[i]) for r in every) for i in range(len(columns))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in every)


def ago(since: float | None, now: float) -> str:
    """How long ago `since` (Unix seconds) was, as 4m05s or 2h07m; "-" when unknown."""
    if since is None:
        return "-"
    s = max(0, int(now - since))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def short(text: str, width: int) -> str:
    """`text` cut to `width` characters, an ellipsis marking the cut."""
    return text if len(text) <= width else text[: width - 1] + "…"


def url_type(default_port: int) -> Callable[[str], str]:
    """An argparse type for a daemon's base URL; the error says what to type instead."""
    def parse(text: str) -> str:
        try:
            return base_url(text, default_port)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return parse


def add_access_flags(p: argparse.ArgumentParser) -> None:
    """--ca-file, --cert-file, --key-file and the credential flags of a read command."""
    p.add_argument("--ca-file", metavar="FILE", help="https: trust this CA (PEM) instead of the system bundle")
    p.add_argument("--cert-file", metavar="FILE", help="https: present this client certificate (PEM), for a daemon "
                                                        "that requires one; with --key-file")
    p.add_argument("--key-file", metavar="FILE", help="the client certificate's key (PEM)")
    # Credentials come from files, never the command line, where `ps` and shell history would show them.
    p.add_argument("--username", metavar="USER", help="basic auth, for a daemon whose web config has "
                                                       "basic_auth_users; with --password-file")
    p.add_argument("--password-file", metavar="FILE", type=Path, help="the basic-auth password (first line)")
    p.add_argument("--token-file", metavar="FILE", type=Path,
                   help="a bearer token (first line), for a daemon whose web config has bearer tokens")


def access_of(args: argparse.Namespace, command: str) -> Access:
    """How the read flags say to reach the daemon (TLS context, credentials); one line and exit 2 when bad."""

    def bad(problem: str) -> SystemExit:
        print(f"gpumond {command}: {problem} (see: gpumond {command} --help)", file=sys.stderr)
        return SystemExit(EXIT_USAGE)

    context = None
    if args.ca_file or args.cert_file or args.key_file:
        try:
            context = ClientTLS(args.ca_file, args.cert_file, args.key_file).context
        except ValueError as e:
            raise bad(str(e)) from None
    if (args.username is None) != (args.password_file is None):
        raise bad("--username and --password-file go together")
    if args.username is not None and args.token_file is not None:
        raise bad("give basic auth (--username, --password-file) or --token-file, not both")
    headers: dict[str, str] = {}
    secret_file = args.password_file or args.token_file
    if secret_file is not None:
        try:
            secret = (secret_file.read_text(encoding="utf-8").splitlines() or [""])[0].strip()
        except (OSError, UnicodeDecodeError) as e:
            raise bad(f"cannot read {secret_file}: {getattr(e, 'strerror', None) or e}") from None
        if not secret:
            raise bad(f"{secret_file} is empty")
        if args.username is not None:
            pair = base64.b64encode(f"{args.username}:{secret}".encode()).decode("ascii")
            headers["Authorization"] = f"Basic {pair}"
        else:
            headers["Authorization"] = f"Bearer {secret}"
    return Access(context, headers)
