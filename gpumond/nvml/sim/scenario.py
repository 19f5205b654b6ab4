"""Scenario files: which GPUs, what load, what inlet air, and which faults when.

Validated with pydantic (extra keys forbidden) and reported as one line that names the
entry and field, e.g. ``demo.yaml: faults[3].kind: unknown fault kind 'coolng' (...)``,
because a scenario typo should fail the demo loudly instead of silently doing nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import pynvml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpumond.config.errors import ConfigError, FieldProblem, format_validation_error
from gpumond.config.load import read_yaml_mapping

from .library import SYMBOLS
from .models import MIG_SLICES, MODELS

Ratio = Annotated[float, Field(ge=0.0, le=1.0)]


class ScenarioError(ValueError):
    """A scenario (file or injected fault) is invalid; the message is one line."""


class LoadPattern(BaseModel):
    """Utilization over time. `utilization` is the constant value or the busy-phase value."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pattern: Literal["constant", "idle", "training"] = "constant"
    utilization: Ratio = 0.9
    # training: a square wave — compute for busy_fraction of each period, then a
    # low phase (optimizer step, data loading, collectives) at low_utilization.
    period_s: Annotated[float, Field(gt=0.0)] = 10.0
    busy_fraction: Annotated[float, Field(gt=0.0, le=1.0)] = 0.85
    low_utilization: Ratio = 0.3
    phase_s: float = 0.0
    noise: Annotated[float, Field(ge=0.0, le=0.5)] = 0.0  # ± uniform, re-drawn each second
    # Power drawn per unit of utilization. NCCL kernels spinning in a collective read ~100 %
    # utilization at low power: model that as high utilization with low intensity.
    intensity: Annotated[float, Field(ge=0.0, le=1.5)] = 1.0
    memory_used_fraction: Ratio | None = None  # None: 85 % when running, ~0 when idle
    # SM activity (GPM's SM_UTIL: share of SMs busy) per unit of utilization. None: 0.85 × intensity, so
    # a GPU spinning in collectives (high utilization, low intensity) also shows low SM activity.
    sm_activity: Ratio | None = None
    # Video engines (NVENC / NVDEC) busy while the GPU runs: 0 for training, set for video work.
    encoder_utilization: Ratio = 0.0
    decoder_utilization: Ratio = 0.0


LOAD_FIELDS = tuple(LoadPattern.model_fields)

# What a node runs when nothing says otherwise: a synchronous training job.
DEFAULT_LOAD = LoadPattern(pattern="training", utilization=0.95, period_s=10.0,
                           busy_fraction=0.85, low_utilization=0.35, noise=0.02)


class InletProfile(BaseModel):
    """Cold-aisle air temperature: base plus a slow sinusoidal swing (day/night, CRAC cycling)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_c: Annotated[float, Field(ge=-10.0, le=60.0)] = 30.0
    swing_c: Annotated[float, Field(ge=0.0, le=30.0)] = 0.0
    period_s: Annotated[float, Field(gt=0.0)] = 86400.0


class GpuEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    index: Annotated[int, Field(ge=0)]
    model: str = "h100-sxm"
    load: LoadPattern | None = None  # this GPU's own base load instead of default_load
    inlet_offset_c: float = 0.0  # rack position: the top of a rack breathes warmer air
    # MIG mode on, with one GPU instance (holding one full compute instance) per profile listed, e.g.
    # ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]; None: MIG mode off.
    mig: list[str] | None = None

    @field_validator("model")
    @classmethod
    def _known_model(cls, v: str) -> str:
        if v not in MODELS:
            raise ValueError(f"unknown model {v!r} (expected one of {', '.join(sorted(MODELS))})")
        return v

    @model_validator(mode="after")
    def _mig_fits(self) -> GpuEntry:
        if self.mig is None:
            return self
        spec = MODELS[self.model]
        if not spec.has_mig:
            raise FieldProblem("mig", f"model {self.model!r} has no MIG mode")
        for name in self.mig:
            if name not in spec.mig_profiles:
                raise FieldProblem("mig", f"unknown MIG profile {name!r} for {self.model} "
                                           f"(expected one of {', '.join(spec.mig_profiles)})")
        used = sum(spec.mig_profiles[name].slices for name in self.mig)
        if used > MIG_SLICES:
            raise FieldProblem("mig", f"the profiles take {used} compute slices; a GPU has {MIG_SLICES}")
        return self


# kind -> (required params, optional params). `gpu`, `at_s`, `duration_s` are common.
FAULT_PARAMS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "cooling": (frozenset({"factor"}), frozenset()),
    "inlet": (frozenset({"delta_c"}), frozenset()),
    "xid": (frozenset({"code"}), frozenset({"count"})),
    "ecc_uncorrected": (frozenset(), frozenset({"count"})),
    "ecc_corrected": (frozenset(), frozenset({"count"})),
    "remap_failure": (frozenset(), frozenset()),
    "pcie_replay": (frozenset(), frozenset({"count"})),
    "lost": (frozenset(), frozenset()),
    "slow": (frozenset({"factor"}), frozenset()),
    "load": (frozenset({"pattern"}), frozenset(LOAD_FIELDS) - {"pattern"}),
    "nvml_error": (frozenset({"function", "error"}), frozenset({"count"})),
    "no_permission_on_set": (frozenset(), frozenset()),
    # Busy but idle: utilization unchanged (a kernel always runs) while SM activity and power collapse;
    # `factor` is the SM activity per unit of utilization that remains (default 0.05).
    "busy_idle": (frozenset(), frozenset({"factor"})),
    # One NVLink (`link`, default 0) replays: `rate` replays per second (default 2000), CRC flit errors at
    # half that rate, and its throughput halves while the fault lasts.
    "nvlink_degraded": (frozenset(), frozenset({"link", "rate"})),
    # One NVLink goes down (state inactive, no traffic; one recovery counted) while the fault lasts.
    "nvlink_down": (frozenset(), frozenset({"link"})),
}
FAULT_KINDS = tuple(FAULT_PARAMS)
# Kinds that may leave `gpu` out: inlet air is shared; an NVML error may hit system calls.
_GPU_OPTIONAL = frozenset({"inlet", "nvml_error"})
# Kinds that happen once; `duration_s` on them has nothing to end.
INSTANT_KINDS = frozenset({"xid", "ecc_uncorrected", "ecc_corrected", "pcie_replay"})

# "gpu_is_lost" -> 15, from pynvml's NVML_ERROR_* constants.
ERROR_CODES: dict[str, int] = {
    name[len("NVML_ERROR_"):].lower(): getattr(pynvml, name)
    for name in dir(pynvml) if name.startswith("NVML_ERROR_")
}


class Fault(BaseModel):
    """One scheduled (or injected) fault. Parameters depend on `kind`; see FAULT_PARAMS."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str
    gpu: int | Literal["all"] | None = None
    at_s: Annotated[float, Field(ge=0.0)] | None = None
    duration_s: Annotated[float, Field(gt=0.0)] | None = None
    factor: Annotated[float, Field(gt=0.0)] | None = None
    delta_c: float | None = None
    code: Annotated[int, Field(ge=1, le=1000)] | None = None
    count: Annotated[int, Field(ge=1)] | None = None
    function: str | None = None
    error: str | None = None
    link: Annotated[int, Field(ge=0)] | None = None
    rate: Annotated[float, Field(gt=0.0)] | None = None
    # `load` parameters, flat in the entry (same meaning as in LoadPattern).
    pattern: Literal["constant", "idle", "training"] | None = None
    utilization: Ratio | None = None
    period_s: Annotated[float, Field(gt=0.0)] | None = None
    busy_fraction: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    low_utilization: Ratio | None = None
    phase_s: float | None = None
    noise: Annotated[float, Field(ge=0.0, le=0.5)] | None = None
    intensity: Annotated[float, Field(ge=0.0, le=1.5)] | None = None
    memory_used_fraction: Ratio | None = None
    sm_activity: Ratio | None = None
    encoder_utilization: Ratio | None = None
    decoder_utilization: Ratio | None = None

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, v: str) -> str:
        if v not in FAULT_PARAMS:
            raise ValueError(f"unknown fault kind {v!r} (expected one of {', '.join(FAULT_KINDS)})")
        return v

    @field_validator("gpu", mode="before")
    @classmethod
    def _gpu_index(cls, v: Any) -> Any:
        # One clear message instead of pydantic's two-branch union complaint.
        if v is None or v == "all" or (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
            return v
        raise ValueError(f"expected a GPU index (>= 0) or 'all', got {v!r}")

    @field_validator("error")
    @classmethod
    def _known_error(cls, v: str | None) -> str | None:
        if v is not None and v not in ERROR_CODES:
            raise ValueError(f"unknown NVML error {v!r} (e.g. not_supported, no_permission, "
                             "unknown, gpu_is_lost, insufficient_power, timeout)")
        return v

    @field_validator("function")
    @classmethod
    def _known_function(cls, v: str | None) -> str | None:
        if v is not None and v not in SYMBOLS:
            raise ValueError(f"unknown NVML function {v!r} (not one the simulator implements)")
        return v

    @model_validator(mode="after")
    def _params_fit_kind(self) -> Fault:
        required, optional = FAULT_PARAMS[self.kind]
        given = {name for name in self.model_fields_set
                 if name not in ("kind", "gpu", "at_s", "duration_s") and getattr(self, name) is not None}
        for name in sorted(required - given):
            raise FieldProblem(name, f"required for kind {self.kind!r}")
        for name in sorted(given - required - optional):
            raise FieldProblem(name, f"not a parameter of kind {self.kind!r}")
        if self.gpu is None and self.kind not in _GPU_OPTIONAL:
            raise FieldProblem("gpu", f"required for kind {self.kind!r}")
        if self.kind in ("slow", "busy_idle") and self.factor is not None and self.factor > 1.0:
            raise FieldProblem("factor", "a slowdown factor must be in (0, 1]" if self.kind == "slow"
                               else "an SM activity factor must be in (0, 1]")
        return self

    def load_pattern(self) -> LoadPattern:
        """The LoadPattern a `load` fault switches to."""
        params = {name: getattr(self, name) for name in LOAD_FIELDS if getattr(self, name) is not None}
        return LoadPattern(**params)

    def error_code(self) -> int:
        return ERROR_CODES[self.error] if self.error else 0


MAX_FAULTS = 10_000


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    gpus: list[GpuEntry] = Field(default_factory=list)
    default_load: LoadPattern = DEFAULT_LOAD
    inlet: InletProfile = InletProfile()
    # A fault costs ~5 KB once loaded (benchmarks/results/config_size.md): a scenario is a story of a few, and
    # tens of thousands are a generated file gone wrong, which would hold the agent's start for seconds.
    faults: list[Fault] = Field(default_factory=list, max_length=MAX_FAULTS)

    @model_validator(mode="after")
    def _unique_indexes(self) -> Scenario:
        seen: set[int] = set()
        for i, entry in enumerate(self.gpus):
            if entry.index in seen:
                raise FieldProblem(f"gpus[{i}].index", f"GPU {entry.index} is listed twice")
            seen.add(entry.index)
        return self


def parse_scenario(data: Any, source: str = "scenario") -> Scenario:
    if data is None:
        data = {}  # an empty file is the healthy default scenario
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: top level must be a mapping of keys (got {type(data).__name__})")
    try:
        return Scenario.model_validate(data)
    except ValidationError as err:
        raise ScenarioError(format_validation_error(source, err, Scenario)) from None


def parse_fault(data: Any, source: str = "fault") -> Fault:
    if isinstance(data, Fault):
        return data
    try:
        return Fault.model_validate(data)
    except ValidationError as err:
        raise ScenarioError(format_validation_error(source, err, Fault)) from None


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    try:
        data = read_yaml_mapping(path)
    except ConfigError as err:
        raise ScenarioError(f"{path.name}: {err.problem}") from None
    return parse_scenario(data, path.name)
