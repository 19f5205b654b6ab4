"""Bearer tokens as both daemons' configs take them: what a token may be, and a token file (one a line, `#`
comments), for the rules service's push `tokens_file` and a web config's read-side `bearer_tokens_file`."""

from __future__ import annotations

import re
from pathlib import Path

from gpumond.config.errors import ConfigError

# RFC 6750 b64token, so a token always fits an Authorization header unquoted; 16 characters is
# the floor of a random secret (`openssl rand -hex 16` gives 32).
_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]{16,512}=*")
_TOKEN_RULE = "must be 16-512 characters of A-Z a-z 0-9 - . _ ~ + / (then optional '=' padding)"


def token_problem(token: str) -> str | None:
    """Why `token` cannot be a bearer token, or None when it can."""
    return None if _TOKEN.fullmatch(token) else _TOKEN_RULE


def read_tokens_file(path: Path, source: str, key: str = "tokens_file") -> list[str]:
    """The bearer tokens in a token file (one a line, `#` comments), for the push API's `tokens_file` and the
    web config's read-side `bearer_tokens_file`; ConfigError naming `key` when unreadable or bad."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(source, f"{key}: cannot read {path}: not UTF-8 text") from None
    except OSError as err:
        raise ConfigError(source, f"{key}: cannot read {path}: {err.strerror or err}") from None
    tokens = []
    for number, line in enumerate(text.splitlines(), start=1):
        token = line.split("#", 1)[0].strip()
        if not token:
            continue
        if problem := token_problem(token):
            raise ConfigError(source, f"{key}: {path} line {number}: {problem}")
        tokens.append(token)
    return tokens
