"""Who this rank is and where it reports: explicit arguments first, then the environment."""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpumond.wire.identity import DEVICE_UUID, JOB_ENV_VARS, clean_label, first_env
from gpumond.wire.media import ENCODINGS
from gpumond.wire.routing import MAX_SHARDS, PLACEHOLDER
from gpumond.wire.safetext import UNSAFE
from gpumond.wire.tlsclient import CA_FILE_ENV, CERT_FILE_ENV, KEY_FILE_ENV, ClientTLS

# torchrun inside an sbatch allocation sets both; RANK is the global rank torchrun assigned,
# SLURM_PROCID only the launcher task's index.
RANK_ENV = ("RANK", "SLURM_PROCID")
WORLD_SIZE_ENV = ("WORLD_SIZE", "SLURM_NTASKS")


class ConfigError(Exception):
    """A required setting is missing or malformed; the reporter disables itself."""


@dataclass(frozen=True, slots=True)
class Identity:
    """The fields every push carries before its steps."""

    job: str
    rank: int
    world_size: int
    node: str
    gpu_uuid: str
    group: str | None

    def head(self) -> dict[str, object]:
        """The payload's fixed part, in contract order (an unknown GPU, left to the node relay, left out)."""
        head: dict[str, object] = {"job": self.job, "rank": self.rank, "world_size": self.world_size,
                                   "node": self.node, "gpu_uuid": self.gpu_uuid, "group": self.group}
        if not self.gpu_uuid:
            del head["gpu_uuid"]
        return head


def resolve_identity(*, job: str | None, rank: int | None, world_size: int | None, node: str | None,
                     gpu_uuid: str | None, group: str | None, environ: Mapping[str, str],
                     find_gpu: Callable[[Mapping[str, str]], str | None], gpu_optional: bool = False) -> Identity:
    """Fill every identity field from its argument, else the environment; ConfigError names what is missing.
    `gpu_optional`: pushing through a node relay, which finds the GPU itself (gpu_uuid is then "" when unknown)."""
    job_value = clean_label(job)
    if job_value is None:
        found = first_env(environ, JOB_ENV_VARS)
        if found is None:
            raise ConfigError(f"no job id: pass job= or set one of {', '.join(JOB_ENV_VARS)}")
        job_value = found[1]
    rank_value = _int_setting("rank", rank, environ, RANK_ENV, default=0, minimum=0)
    world_value = _int_setting("world_size", world_size, environ, WORLD_SIZE_ENV, default=1, minimum=1)
    if rank_value >= world_value:
        raise ConfigError(f"rank {rank_value} is not below world_size {world_value}")
    node_value = (clean_label(node) or clean_label(environ.get("GPUMOND_NODE"))
                  or clean_label(socket.gethostname()))
    if node_value is None:
        raise ConfigError("no node name: pass node= or set GPUMOND_NODE")
    uuid, source = clean_label(gpu_uuid), "gpu_uuid"
    if uuid is None:
        uuid, source = clean_label(environ.get("GPUMOND_GPU_UUID")), "GPUMOND_GPU_UUID"
    if uuid is None:
        uuid, source = clean_label(find_gpu(environ)), "the local device"
    if uuid is None and gpu_optional:
        return Identity(job_value, rank_value, world_value, node_value, "", _group(group, environ))
    if uuid is None:
        raise ConfigError("could not find this rank's GPU UUID: pass gpu_uuid= or set GPUMOND_GPU_UUID")
    # NVML's forms, which the agent exports and the rules service joins on; anything else would be refused
    # on every push, so it is caught here once.
    if not DEVICE_UUID.fullmatch(uuid):
        raise ConfigError(f"{source} must be an NVML GPU UUID, GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, or a "
                          f"MIG device's, MIG-xxxxxxxx-… (got {uuid!r})")
    return Identity(job_value, rank_value, world_value, node_value, uuid, _group(group, environ))


def _group(group: str | None, environ: Mapping[str, str]) -> str | None:
    return clean_label(group) if group is not None else clean_label(environ.get("GPUMOND_GROUP"))


def _int_setting(field: str, explicit: int | None, environ: Mapping[str, str], names: tuple[str, ...],
                 *, default: int, minimum: int) -> int:
    """An integer from the argument, else the first set variable, else the default; range-checked."""
    source, raw = field, explicit
    if raw is None:
        found = first_env(environ, names)
        if found is None:
            return default
        source, raw = found
    try:
        # bool and float are ints to int(); a rank of True or 2.5 is a bug to report, not round.
        if isinstance(raw, (bool, float)):
            raise ValueError
        value = int(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{source} must be an integer (got {raw!r})") from None
    if value < minimum:
        raise ConfigError(f"{source} must be ≥ {minimum} (got {raw!r})")
    return value


def resolve_endpoint(endpoint: str | None, environ: Mapping[str, str], *, optional: bool = False) -> str | None:
    """The rules service's base URL from the argument or GPUMOND_ENDPOINT; None only when `optional` (a node relay
    was named, which knows the rules service)."""
    value = clean_label(endpoint) or clean_label(environ.get("GPUMOND_ENDPOINT"))
    if value is None and not optional:
        raise ConfigError("no endpoint: pass endpoint= or set GPUMOND_ENDPOINT (e.g. http://rules:9481), or set "
                          "GPUMOND_RELAY to this node's gpumond agent (docs/job-sdk.md)")
    return value


# The agent's relay listens here by default (its relay.listen): a rank on a node with an agent reaches it without
# being told. GPUMOND_RELAY names another address (the chart: the node's own), or `off`.
DEFAULT_RELAY = "http://127.0.0.1:9482"
RELAY_OFF = "off"


def resolve_relay(relay: str | None, environ: Mapping[str, str]) -> tuple[str | None, bool]:
    """(the node relay's URL or None when off, whether it was named explicitly) from the argument or GPUMOND_RELAY;
    unset: the loopback default, tried first and left for GPUMOND_ENDPOINT while it does not answer."""
    value = clean_label(relay) or clean_label(environ.get("GPUMOND_RELAY"))
    if value is None:
        return DEFAULT_RELAY, False
    if value.lower() == RELAY_OFF:
        return None, True
    return value, True


def resolve_encoding(encoding: str | None, environ: Mapping[str, str]) -> str:
    """The push encoding from the argument, else GPUMOND_PUSH_ENCODING: "json" (default) or "columns"."""
    value = clean_label(encoding) or clean_label(environ.get("GPUMOND_PUSH_ENCODING")) or "json"
    if value not in ENCODINGS:
        raise ConfigError(f"push encoding must be {' or '.join(ENCODINGS)} (got {value!r}; GPUMOND_PUSH_ENCODING "
                          "or encoding=)")
    return value


def resolve_shards(shards: int | None, endpoint: str, environ: Mapping[str, str]) -> int | None:
    """How many rules shards to route among (argument, else GPUMOND_SHARDS), checked against `{shard}`."""
    count = None
    if shards is not None or clean_label(environ.get("GPUMOND_SHARDS")) is not None:
        count = _int_setting("shards", shards, environ, ("GPUMOND_SHARDS",), default=1, minimum=1)
        if count > MAX_SHARDS:
            raise ConfigError(f"shards must be ≤ {MAX_SHARDS}, the rules service's limit (got {count})")
    # Either half without the other would send every push to one address, most of them to the wrong shard.
    if count is not None and PLACEHOLDER not in endpoint:
        raise ConfigError(f"shards is {count} but the endpoint has no {PLACEHOLDER} to put the shard number in "
                          f"(e.g. http://gpumond-rules-{PLACEHOLDER}.gpumond-rules-shards:9481; got {endpoint!r})")
    if count is None and PLACEHOLDER in endpoint:
        raise ConfigError(f"the endpoint has {PLACEHOLDER}: pass shards= or set GPUMOND_SHARDS to the number of "
                          f"rules replicas (N of --shard I/N)")
    return count


def resolve_tls(ca_file: str | None, cert_file: str | None, key_file: str | None,
                environ: Mapping[str, str]) -> ClientTLS | None:
    """The client TLS settings from the arguments, else GPUMOND_CA_FILE / _CLIENT_CERT_FILE / _CLIENT_KEY_FILE;
    None when none is set (an https endpoint is then verified with the system CA bundle)."""
    ca = ca_file or clean_label(environ.get(CA_FILE_ENV))
    cert = cert_file or clean_label(environ.get(CERT_FILE_ENV))
    key = key_file or clean_label(environ.get(KEY_FILE_ENV))
    if ca is None and cert is None and key is None:
        return None
    if (cert is None) != (key is None):
        raise ConfigError(f"a client certificate needs both {CERT_FILE_ENV} and {KEY_FILE_ENV} (or cert_file= and "
                          f"key_file=)")
    try:
        return ClientTLS(ca, cert, key)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def resolve_token(token: str | None, environ: Mapping[str, str], *, optional: bool = False) -> str | None:
    """The bearer token from the argument, GPUMOND_TOKEN, or the file GPUMOND_TOKEN_FILE names; None only when
    `optional` (a named node relay may push under its own node credential)."""
    value = (token or environ.get("GPUMOND_TOKEN") or "").strip()
    if not value and environ.get("GPUMOND_TOKEN_FILE"):
        path = Path(environ["GPUMOND_TOKEN_FILE"])
        try:
            value = path.read_text().strip()
        except OSError as exc:
            # The path is not secret; the content would be, so it never appears in a message.
            raise ConfigError(f"cannot read GPUMOND_TOKEN_FILE {str(path)!r}: {exc.strerror or exc}") from None
    if not value and optional:
        return None
    if not value:
        raise ConfigError("no token: pass token= or set GPUMOND_TOKEN or GPUMOND_TOKEN_FILE")
    if any(c.isspace() for c in value) or UNSAFE.search(value):
        raise ConfigError("the token contains whitespace or control characters")
    return value
