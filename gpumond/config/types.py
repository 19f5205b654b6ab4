"""Shared vocabulary of the config models: the strict base model and the listen address."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, GetCoreSchemaHandler, PlainValidator
from pydantic_core import core_schema


class ConfigModel(BaseModel):
    """Base of every config section: unknown keys are errors, values are immutable."""

    # strict: YAML already yields typed scalars, so "30" for a number or 1 for a boolean
    # is a mistake worth naming rather than silently coercing. .nan / .inf never make
    # sense as an interval or a size.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


@dataclass(frozen=True, slots=True)
class ListenAddress:
    """A HOST:PORT to bind; an IPv6 host is written in brackets, e.g. [::1]:9480."""

    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> ListenAddress:
        """Parse HOST:PORT; raise ValueError with an operator-facing message."""
        host, sep, port_text = text.strip().rpartition(":")
        if not sep:
            raise ValueError("must be HOST:PORT, e.g. 0.0.0.0:9480")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
            try:
                ipaddress.IPv6Address(host)
            except ValueError:
                raise ValueError(f"{host!r} in brackets is not an IPv6 address") from None
        elif ":" in host:
            # Unbracketed "::1:9480" is ambiguous: is 9480 the port or the last group?
            raise ValueError("an IPv6 host must be in brackets, e.g. [::1]:9480")
        if not host or any(c.isspace() for c in host):
            raise ValueError("host must be a non-empty name or address without spaces")
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise ValueError("port must be a number from 1 to 65535")
        return cls(host, int(port_text))

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            cls._validate,
            serialization=core_schema.plain_serializer_function_ser_schema(str),
            json_schema_input_schema=core_schema.str_schema(),
        )

    @classmethod
    def _validate(cls, value: Any) -> ListenAddress:
        if isinstance(value, cls):
            return value
        if not isinstance(value, str):
            raise ValueError("must be a HOST:PORT string, e.g. 0.0.0.0:9480")
        return cls.parse(value)


# ----- secrets: validated like any value, but never echoed in an error line -------------------------
class Hidden:
    """Wraps a secret on its way through validation so an error shows `<hidden>`, not the value."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __str__(self) -> str:
        return "<hidden>"

    __repr__ = __str__


def _secret_text(hidden: Hidden) -> str:
    if not isinstance(hidden.value, str) or not hidden.value.strip():
        raise ValueError("must be a non-empty string")
    return hidden.value.strip()


SecretText = Annotated[str, PlainValidator(_secret_text), BeforeValidator(Hidden)]


# ----- small value types -------------------------------------------------------------------------
def _http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host")
    return value.rstrip("/")


def _absolute(value: Path) -> Path:
    # A relative path would depend on the daemon's working directory (/ under systemd).
    if not value.is_absolute():
        raise ValueError("must be an absolute path")
    return value


HttpUrl = Annotated[str, Field(min_length=1, max_length=2048), AfterValidator(_http_url)]
AbsolutePath = Annotated[Path, Field(strict=False), AfterValidator(_absolute)]
