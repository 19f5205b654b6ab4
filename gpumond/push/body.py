"""The push body as pydantic models, bounded by the configured limits, and its one-line error messages.

Rules beyond the types (documented in docs/rules-api.md):
- strings are 1..max_string_len characters without control characters (C0, C1, DEL), line or paragraph
  separators (U+2028/9) or bidirectional controls (gpumond/wire/safetext.py): such a label is refused, 422 naming
  the field and the character, because it would split log lines or reorder text on screen; `gpu_uuid` has NVML's
  shape `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (hex, any case; stored lowercase, as the agent exports it),
  or a MIG device's `MIG-xxxxxxxx-…` or older `MIG-GPU-xxxxxxxx-…/<gpu instance>/<compute instance>`;
- 0 <= rank < world_size <= 2**20; at most limits.max_steps_per_push steps, possibly none
  (a heartbeat that only says the rank is alive);
- numbers are finite; step and samples are non-negative integers; `end` is non-negative unix seconds;
  0 <= data_wait_s <= duration_s (+1 µs for clock rounding) <= 86400;
- comm_wait_s is optional (absent or null: not measured; SDKs before 0.2 never send it); when given,
  0 <= comm_wait_s and data_wait_s + comm_wait_s <= duration_s (+1 µs): both waits lie within the step;
- JSON types are strict: "17" is not a rank and 1.0 is not a step; unknown keys are ignored so a newer
  SDK can add fields without breaking an older service;
- `incarnation` is optional (SDKs before it never send it): an id of the pushing process, the same on
  every push of that process; a new one for a known rank means the process restarted (see RankStore.store).

Two encodings of the steps, chosen by Content-Type: `application/json` carries `steps`, a list of objects
(pydantic checks them as it parses); `application/vnd.gpumond.columns+json` carries `columns`, one base64
array of little-endian 8-byte values per field, decoded and checked whole by numpy (push/steps.py).
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, ClassVar

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, GetCoreSchemaHandler, GetPydanticSchema,
                      ValidationError, ValidationInfo, field_validator)
from pydantic_core import core_schema

from gpumond.config.errors import counted, validation_problem
from gpumond.push.steps import MAX_STEP_DURATION_S, StepsError, check_waits, decode, from_records
from gpumond.push.values import RankInfo, StepColumns, StepRecord
from gpumond.wire.identity import DEVICE_UUID, canonical_device_uuid
from gpumond.wire.safetext import UNSAFE_CLASS, first_unsafe

MAX_WORLD_SIZE = 1_048_576  # a sanity bound; how many ranks are *held* is limits.max_ranks
_INT64 = 2**63 - 1
_PRINTABLE = f"^[^{UNSAFE_CLASS}]+$"  # the JSON Schema spelling of _printable
_MODEL = ConfigDict(strict=True, frozen=True, allow_inf_nan=False, extra="ignore")


def _printable(value: str) -> str:
    bad = first_unsafe(value)
    if bad is not None:
        raise ValueError("must not contain control characters, line separators or bidirectional controls "
                         f"(found {bad})")
    return value


def _gpu_uuid(value: str) -> str:
    if not DEVICE_UUID.fullmatch(value):
        raise ValueError("must be an NVML GPU UUID, GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (hex), or a MIG "
                         "device's, MIG-xxxxxxxx-… or MIG-GPU-xxxxxxxx-…/<gpu instance>/<compute instance>")
    return canonical_device_uuid(value)  # one spelling per device, as the rules service's telemetry names it


def _step_schema(source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
    # Validated straight into the shared StepRecord by pydantic-core: no intermediate model per step
    # (half the cost of a push). Constraints live here; the waits' bounds by duration_s are checked in `parse`.
    def field(name: str, schema: core_schema.CoreSchema, description: str) -> core_schema.DataclassField:
        return core_schema.dataclass_field(name, schema, metadata={"pydantic_js_updates": {"description": description}})

    def number(**bounds: float) -> core_schema.FloatSchema:
        return core_schema.float_schema(strict=True, allow_inf_nan=False, **bounds)

    def count() -> core_schema.IntSchema:
        return core_schema.int_schema(strict=True, ge=0, le=_INT64)

    fields = [
        field("step", count(), "step number, unique within the rank"),
        field("end", number(ge=0), "unix seconds when the step ended"),
        field("duration_s", number(ge=0, le=MAX_STEP_DURATION_S), "wall time of the step"),
        field("data_wait_s", number(ge=0), "time blocked on the data loader within the step, at most duration_s"),
        field("samples", core_schema.with_default_schema(core_schema.nullable_schema(count()), default=None),
              "samples processed in the step"),
        field("comm_wait_s", core_schema.with_default_schema(core_schema.nullable_schema(number(ge=0)), default=None),
              "time this rank waited for its peers in the step's collectives; data_wait_s + comm_wait_s is at "
              "most duration_s (optional: absent or null when not measured)"),
    ]
    args = core_schema.dataclass_args_schema("Step", fields, extra_behavior="ignore")
    return core_schema.dataclass_schema(StepRecord, args, [f["name"] for f in fields], slots=True, frozen=True,
                                        strict=True, ref="Step")


Step = Annotated[StepRecord, GetPydanticSchema(_step_schema)]


class PushBody(BaseModel):
    """The whole push; subclasses made by `push_model` / `columns_model` carry the configured limits."""

    model_config = _MODEL

    job: str
    world_size: int
    rank: int
    node: str
    gpu_uuid: str
    group: str | None = None
    incarnation: str | None = None
    # The rank's last push: its process is ending (the SDK sends it from close(), at exit and on SIGTERM).
    final: bool = False
    # Where `parse` puts the decoded steps: a slot, not a pydantic private attribute, whose initialisation and
    # look-up run Python code on every push (~10 % of a columnar push's own work).
    __slots__ = ("_columns",)

    def rank_info(self) -> RankInfo:
        """Who sent it, as the shared RankInfo."""
        return RankInfo(self.job, self.rank, self.world_size, self.node, self.gpu_uuid, self.group)

    def step_columns(self) -> StepColumns:
        """The push's steps as columns, checked (set by `parse`)."""
        columns = getattr(self, "_columns", None)
        assert columns is not None, "parse() sets the columns"
        return columns


class Columns(BaseModel):
    """The columnar encoding's steps: one base64 string of little-endian 8-byte values per field."""

    model_config = _MODEL

    step: str = Field(description="int64 step numbers, each >= 0, unique per rank")
    end: str = Field(description="float64 unix seconds each step ended")
    duration_s: str = Field(description="float64 wall time of each step, 0 to 86400")
    data_wait_s: str = Field(description="float64 data-loader wait of each step, 0 to duration_s")
    comm_wait_s: str | None = Field(None, description="float64 comm wait of each step, NaN where not measured; "
                                                      "data_wait_s + comm_wait_s <= duration_s (optional)")
    samples: str | None = Field(None, description="int64 samples of each step, -1 for none (optional)")


def _head(max_string_len: int, relayed: bool = False) -> type[PushBody]:
    text = Annotated[str, Field(min_length=1, max_length=max_string_len, json_schema_extra={"pattern": _PRINTABLE}),
                     AfterValidator(_printable)]
    uuid = Annotated[str, Field(max_length=56, json_schema_extra={"pattern": f"^(?:{DEVICE_UUID.pattern})$"}),
                     AfterValidator(_gpu_uuid)]

    class Head(PushBody):
        job: text  # type: ignore[valid-type]
        # world_size before rank: the rank validator reads it.
        world_size: int = Field(ge=1, le=MAX_WORLD_SIZE)
        rank: int = Field(ge=0)
        node: text  # type: ignore[valid-type]
        gpu_uuid: uuid  # type: ignore[valid-type]
        group: text | None = None  # type: ignore[valid-type]
        incarnation: text | None = Field(None, description="the pushing process's id, the same on all its pushes; "  # type: ignore[valid-type]
                                         "a new one for a known rank means a restart: its steps count afresh")
        final: bool = Field(default=False, description="true on the rank's last push: its process is ending; "
                                                       "when every held rank of the job has sent it, the job's "
                                                       "findings resolve and its state is released")

        @field_validator("rank")
        @classmethod
        def _below_world_size(cls, value: int, info: ValidationInfo) -> int:
            world = info.data.get("world_size")
            if world is not None and value >= world:
                raise ValueError(f"must be less than world_size ({world})")
            return value

    if not relayed:
        return Head

    class RelayedHead(Head):  # type: ignore[misc,valid-type]
        # What a rank may leave to the node relay, which fills it in (the node, the GPU its process runs on, the
        # job the agent attributes that GPU to) before forwarding; the rest is judged as the service judges it.
        job: text | None = None  # type: ignore[valid-type]
        node: text | None = None  # type: ignore[valid-type]
        gpu_uuid: uuid | None = None  # type: ignore[valid-type]

    return RelayedHead


@functools.cache
def push_model(max_string_len: int, max_steps: int, relayed: bool = False) -> type[PushBody]:
    """The JSON encoding's push with these limits built into its schema (so the OpenAPI document states them too);
    `relayed`: as the node relay takes it (see columns_model)."""

    class Push(_head(max_string_len, relayed)):  # type: ignore[misc]
        steps: list[Step] = Field(max_length=max_steps)

    Push.__name__ = Push.__qualname__ = "Push"
    return Push


@functools.cache
def columns_model(max_string_len: int, max_steps: int, relayed: bool = False) -> type[PushBody]:
    """The columnar encoding's push (Content-Type application/vnd.gpumond.columns+json) with these limits;
    `relayed`: as the node relay takes it from a rank (job, node and gpu_uuid optional)."""
    most = 4 * -(-8 * max_steps // 3)  # base64 length of max_steps 8-byte values
    max_steps_per_push = max_steps  # the class body cannot see a function argument of the same name

    class ColumnsPush(_head(max_string_len, relayed)):  # type: ignore[misc]
        max_steps: ClassVar[int] = max_steps_per_push
        columns: Columns = Field(description=f"the steps, one array per field (at most {max_steps} values, "
                                             f"{most} base64 characters, each)")

    ColumnsPush.__name__ = ColumnsPush.__qualname__ = "ColumnsPush"
    return ColumnsPush


@functools.cache
def head_model(max_string_len: int) -> type[PushBody]:
    """A push's head alone (who pushed it, no steps): how each push of a columnar batch is judged."""
    return _head(max_string_len)


class PayloadError(ValueError):
    """A body that is not a valid push; `status` is 400 (not JSON) or 422 (JSON, but invalid)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def parse(model: type[PushBody], body: bytes) -> PushBody:
    """Parse and validate a push body of either encoding in one pass; PayloadError names where it is wrong."""
    try:
        push = model.model_validate_json(body)
    except ValidationError as err:
        raise PayloadError(*describe(err, model)) from None
    try:
        columns = push.__dict__.get("columns")
        if columns is not None:
            cols = decode(columns.__dict__, model.max_steps)  # type: ignore[attr-defined]
        else:
            cols = from_records(push.steps)  # type: ignore[attr-defined]
            check_waits(cols)
    except StepsError as err:
        raise PayloadError(422, str(err)) from None
    object.__setattr__(push, "_columns", cols)  # the model is frozen to its users; parse completes it
    return push


def describe(err: ValidationError, model: type[PushBody]) -> tuple[int, str]:
    """(status, one line) for a failed push: `steps[3].duration_s: must be at least 0 (got -1)`."""
    first = err.errors(include_url=False)[0]
    if first["type"] == "json_invalid":
        return 400, "invalid JSON: " + first["msg"].removeprefix("Invalid JSON: ")
    if first["type"] in ("model_type", "model_attributes_type", "dict_type"):
        where = _path(first["loc"]) or "body"
        more = len(err.errors()) - 1
        return 422, f"{where}: must be a JSON object" + counted(more)
    return 422, validation_problem(err, model, more=counted)


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
