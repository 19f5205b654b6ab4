"""The field check's comparisons: pure functions from what nvidia-smi, the agent and the rules service said to checks.

benchmarks/gpu_field_check.py runs the processes and hands their output here; tests/unit/test_field_compare.py
feeds these functions fixed text. Every check states its tolerance in the result, so a reader can judge it.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

MIB = 1024 * 1024
UNSUPPORTED = frozenset({"[N/A]", "[Not Supported]", "N/A", "Not Supported", "[Unknown Error]", ""})


@dataclass(frozen=True, slots=True)
class Tolerance:
    """|agent − driver| ≤ max(abs, rel × |driver|), in the agent's units."""

    abs: float = 0.0
    rel: float = 0.0

    def allows(self, driver: float, agent: float) -> bool:
        return abs(agent - driver) <= max(self.abs, self.rel * abs(driver)) + 1e-9

    def text(self, unit_scale: float = 1.0, unit: str = "") -> str:
        parts = []
        if self.abs or not self.rel:
            parts.append(f"±{self.abs / unit_scale:g}{unit}")
        if self.rel:
            parts.append(f"±{self.rel:.0%}")
        return " or ".join(parts)


@dataclass(frozen=True, slots=True)
class Field:
    """One nvidia-smi `--query-gpu` field and the agent series that carries the same reading."""

    smi: tuple[str, ...]  # nvidia-smi's names for it, preferred first (older drivers know fewer)
    series: str  # the agent's series, extra labels included, as `readings()` keys it
    scale: float  # nvidia-smi's unit (with nounits) → the agent's base unit
    unit: str  # nvidia-smi's unit, for the result
    tol: Tolerance  # in the agent's units
    why: str = ""  # why that tolerance


# Tolerances: the two read a moment apart (the agent's value is from its last fast cycle, ≤ 1 s old), and both
# round (nvidia-smi prints W with two decimals, MHz and MiB as integers, % as integers).
FIELDS: tuple[Field, ...] = (
    Field(("temperature.gpu",), "gpumond_gpu_temperature_celsius", 1.0, " °C", Tolerance(abs=2.0),
          "moves ~1 °C a second under a changing load"),
    Field(("temperature.memory",), "gpumond_gpu_memory_temperature_celsius", 1.0, " °C", Tolerance(abs=2.0)),
    Field(("power.draw.average", "power.draw"), "gpumond_gpu_power_watts", 1.0, " W", Tolerance(abs=15.0, rel=0.1),
          "both a ~1 s average, read up to a second apart"),
    Field(("enforced.power.limit",), "gpumond_gpu_power_limit_watts", 1.0, " W", Tolerance(abs=1.0)),
    Field(("power.min_limit",), "gpumond_gpu_power_limit_min_watts", 1.0, " W", Tolerance(abs=1.0)),
    Field(("power.max_limit",), "gpumond_gpu_power_limit_max_watts", 1.0, " W", Tolerance(abs=1.0)),
    Field(("power.default_limit",), "gpumond_gpu_power_limit_default_watts", 1.0, " W", Tolerance(abs=1.0)),
    Field(("clocks.sm",), "gpumond_gpu_sm_clock_hertz", 1e6, " MHz", Tolerance(abs=100e6, rel=0.1),
          "the clock steps with load within a second"),
    Field(("clocks.mem",), "gpumond_gpu_memory_clock_hertz", 1e6, " MHz", Tolerance(abs=50e6, rel=0.05)),
    Field(("clocks.max.sm",), "gpumond_gpu_sm_clock_max_hertz", 1e6, " MHz", Tolerance(abs=1e6)),
    Field(("utilization.gpu",), "gpumond_gpu_utilization_ratio", 0.01, " %", Tolerance(abs=0.1),
          "NVML's utilization is over a sample period that ends at each read"),
    Field(("utilization.memory",), "gpumond_gpu_memory_utilization_ratio", 0.01, " %", Tolerance(abs=0.1)),
    Field(("memory.total",), "gpumond_gpu_memory_total_bytes", MIB, " MiB", Tolerance(abs=2 * MIB)),
    Field(("memory.used",), "gpumond_gpu_memory_used_bytes", MIB, " MiB", Tolerance(abs=256 * MIB, rel=0.02),
          "a process may allocate between the two reads"),
    *(Field((f"ecc.errors.{kind}.{scope}.total",),
            f'gpumond_gpu_ecc_errors_total{{scope="{scope}",type="{kind}"}}', 1.0, "", Tolerance())
      for scope in ("volatile", "aggregate") for kind in ("corrected", "uncorrected")),
)
IDENTITY = {"uuid": "uuid", "name": "name", "pci.bus_id": "pci_bus_id"}  # nvidia-smi field → gpumond_gpu_info label
# Read from nvidia-smi for the result and the before/after comparison; the agent exports none of them.
SETTINGS = ("power.limit", "ecc.mode.current", "persistence_mode", "mig.mode.current", "clocks.applications.graphics",
            "clocks.applications.memory", "compute_mode")
CLOCK_EVENTS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")  # the older drivers' name second
REPORTED = ("pcie.link.gen.current", "pcie.link.width.current", "pcie.link.gen.max", "pcie.link.width.max",
            *CLOCK_EVENTS, "driver_version", "vbios_version")


def wanted_fields() -> list[str]:
    """Every nvidia-smi field the check asks for (the ones the driver knows are kept by `usable_fields`)."""
    names = ["index", *IDENTITY, *(n for f in FIELDS for n in f.smi), *SETTINGS, *REPORTED]
    return list(dict.fromkeys(names))


@dataclass(frozen=True, slots=True)
class Check:
    """One line of the result: ok True/False, or None for a figure reported without a pass/fail."""

    section: str
    name: str
    ok: bool | None
    detail: str


def failed(checks: Iterable[Check]) -> list[Check]:
    return [c for c in checks if c.ok is False]


# ----- parsing ------------------------------------------------------------------------------------------------
def usable_fields(help_text: str, wanted: Sequence[str]) -> tuple[list[str], list[str]]:
    """(fields this nvidia-smi knows, fields it does not) from `nvidia-smi --help-query-gpu`: asking for an unknown
    field makes nvidia-smi fail the whole query. A field's line names it and its aliases, each quoted
    (`"clocks.current.sm" or "clocks.sm"`); description lines do not start with a quote."""
    known = {name for line in help_text.splitlines() if line.lstrip().startswith('"')
             for name in re.findall(r'"([A-Za-z0-9_.\-]+)"', line)}
    return [f for f in wanted if f in known], [f for f in wanted if f not in known]


def parse_smi_csv(text: str, fields: Sequence[str]) -> dict[int, dict[str, str | None]]:
    """`--query-gpu=<fields> --format=csv,noheader,nounits` → {gpu index: {field: text, None if unsupported}};
    `index` must be among the fields."""
    if "index" not in fields:
        raise ValueError("the query must include 'index'")
    rows: dict[int, dict[str, str | None]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(fields):
            raise ValueError(f"nvidia-smi gave {len(cells)} values for {len(fields)} fields: {line!r}")
        row = {f: (None if c in UNSUPPORTED else c) for f, c in zip(fields, cells, strict=True)}
        rows[int(row["index"] or -1)] = row
    return rows


def number(text: str | None) -> float | None:
    """nvidia-smi's value as a number: decimal, or hexadecimal for bitmasks; None when it has none."""
    if text is None:
        return None
    try:
        return float(int(text, 16)) if text.lower().startswith("0x") else float(text)
    except ValueError:
        return None


def _key(name: str, labels: Mapping[str, str]) -> str:
    extra = {k: v for k, v in labels.items() if k not in ("gpu", "uuid")}
    if not extra:
        return name
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(extra.items())) + "}"


@dataclass(frozen=True, slots=True)
class Scrape:
    """One /metrics text: per GPU {series key: value} (keys as `_key` writes them), each GPU's info labels,
    and the count of samples."""

    gpus: Mapping[int, Mapping[str, float]]
    info: Mapping[int, Mapping[str, str]]
    series: int
    node: Mapping[str, float]  # series without a gpu label


def parse_scrape(text: str) -> Scrape:
    """Parse the agent's exposition with prometheus-client's own parser (a malformed exposition raises)."""
    gpus: dict[int, dict[str, float]] = {}
    info: dict[int, dict[str, str]] = {}
    node: dict[str, float] = {}
    count = 0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            count += 1
            if "gpu" not in s.labels or "mig_uuid" in s.labels:
                node[_key(s.name, s.labels)] = s.value
                continue
            gpu = int(s.labels["gpu"])
            gpus.setdefault(gpu, {})[_key(s.name, s.labels)] = s.value
            if s.name == "gpumond_gpu_info":
                info[gpu] = dict(s.labels)
    return Scrape(gpus, info, count, node)


_LOG_FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')


def unsupported_from_log(text: str) -> list[tuple[str, str, str, str]]:
    """(gpu, reader, call, error) of every NVML call the agent logged as not available, in order, once each."""
    seen: dict[tuple[str, str, str, str], None] = {}
    for line in text.splitlines():
        if 'msg="nvml call not available"' not in line:
            continue
        kv = {k: v.strip('"') for k, v in _LOG_FIELD.findall(line)}
        seen[(kv.get("gpu", "?"), kv.get("reader", "?"), kv.get("call", "?"), kv.get("error", "?"))] = None
    return list(seen)


# ----- agent against the driver -------------------------------------------------------------------------------
def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def compare_readings(pairs: Sequence[tuple[Mapping[int, Mapping[str, str | None]], Scrape]],
                     fields: Sequence[Field] = FIELDS) -> list[Check]:
    """Each field of each GPU over paired reads (nvidia-smi, then the agent's /metrics at once): the medians must
    agree within the field's tolerance; a value one side has and the other lacks is a failure too."""
    checks: list[Check] = []
    gpus = sorted(pairs[0][0]) if pairs else []
    for gpu in gpus:
        for f in fields:
            name = next((n for n in f.smi if any(n in smi.get(gpu, {}) for smi, _ in pairs)), f.smi[0])
            drv = [v for smi, _ in pairs if (v := number(smi.get(gpu, {}).get(name))) is not None]
            agt = [v for _, sc in pairs if (v := sc.gpus.get(gpu, {}).get(f.series)) is not None]
            label = f"GPU {gpu} {name}"
            tol = f.tol.text(f.scale, f.unit)
            if not drv and not agt:
                checks.append(Check("driver", label, True, "unsupported by both (nvidia-smi: N/A; agent: absent)"))
                continue
            if not drv or not agt:
                has = "nvidia-smi" if drv else "the agent"
                lacks = "the agent leaves it out" if drv else "nvidia-smi says N/A"
                checks.append(Check("driver", label, False, f"only {has} has a value ({lacks})"))
                continue
            d, a = _median(drv) * f.scale, _median(agt)
            ok = f.tol.allows(d, a)
            checks.append(Check("driver", label, ok, f"nvidia-smi {d / f.scale:g}{f.unit}, agent {a / f.scale:g}"
                                f"{f.unit} (medians of {len(drv)}/{len(agt)} reads; tolerance {tol}"
                                f"{'; ' + f.why if f.why else ''})"))
    return checks


def compare_identity(smi: Mapping[int, Mapping[str, str | None]], scrape: Scrape) -> list[Check]:
    """UUID, name and PCI bus id of each GPU: nvidia-smi's against the agent's gpumond_gpu_info labels, exactly
    (bus ids compared case-insensitively: NVML prints hex digits in upper case, some tools in lower)."""
    checks = []
    for gpu, row in sorted(smi.items()):
        labels = scrape.info.get(gpu)
        if labels is None:
            checks.append(Check("driver", f"GPU {gpu} identity", False, "the agent exports no gpumond_gpu_info"))
            continue
        for field, label in IDENTITY.items():
            want, got = row.get(field) or "", labels.get(label, "")
            ok = want.lower() == got.lower() if field == "pci.bus_id" else want == got
            checks.append(Check("driver", f"GPU {gpu} {field}", ok, f"nvidia-smi {want!r}, agent {got!r}"))
    return checks


def compare_ecc_mode(smi: Mapping[int, Mapping[str, str | None]], scrape: Scrape) -> list[Check]:
    """ECC counters are exported exactly when nvidia-smi says ECC is enabled (NVML refuses them otherwise)."""
    checks = []
    for gpu, row in sorted(smi.items()):
        mode = row.get("ecc.mode.current")
        has = any(k.startswith("gpumond_gpu_ecc_errors_total") for k in scrape.gpus.get(gpu, {}))
        if mode is None:
            checks.append(Check("driver", f"GPU {gpu} ecc.mode.current", None,
                                f"nvidia-smi: N/A; agent exports ECC counters: {'yes' if has else 'no'}"))
            continue
        ok = has == (mode == "Enabled")
        checks.append(Check("driver", f"GPU {gpu} ecc.mode.current", ok,
                            f"nvidia-smi {mode}; agent exports ECC counters: {'yes' if has else 'no'}"))
    return checks


def compare_clock_events(pairs: Sequence[tuple[Mapping[int, Mapping[str, str | None]], Scrape]]) -> list[Check]:
    """The active clock-event reasons must agree in at least one paired read, the GpuIdle bit (0x1) aside: reasons
    change within a sample period, and idle flips at every kernel boundary."""
    checks = []
    gpus = sorted(pairs[0][0]) if pairs else []
    for gpu in gpus:
        seen = []
        for smi, sc in pairs:
            row = smi.get(gpu, {})
            d = number(next((row[n] for n in CLOCK_EVENTS if row.get(n) is not None), None))
            a = sc.gpus.get(gpu, {}).get("gpumond_gpu_clocks_event_reasons_bitmask")
            if d is not None and a is not None:
                seen.append((int(d) & ~1, int(a) & ~1))
        if not seen:
            checks.append(Check("driver", f"GPU {gpu} clocks_event_reasons.active", None,
                                "not read by both (unsupported on one side)"))
            continue
        ok = any(d == a for d, a in seen)
        checks.append(Check("driver", f"GPU {gpu} clocks_event_reasons.active", ok,
                            "pairs (nvidia-smi, agent) without GpuIdle: "
                            + ", ".join(f"(0x{d:x}, 0x{a:x})" for d, a in seen)))
    return checks


def settings_unchanged(before: Mapping[int, Mapping[str, str | None]],
                       after: Mapping[int, Mapping[str, str | None]], fields: Sequence[str] = SETTINGS) -> list[Check]:
    """Every GPU setting nvidia-smi shows is the same after the check as before it."""
    checks = []
    for gpu in sorted(before):
        changed = [f"{f}: {before[gpu].get(f)!r} → {after.get(gpu, {}).get(f)!r}" for f in fields
                   if f in before[gpu] and before[gpu].get(f) != after.get(gpu, {}).get(f)]
        shown = ", ".join(f"{f}={before[gpu].get(f) or 'N/A'}" for f in fields if f in before[gpu])
        checks.append(Check("settings", f"GPU {gpu} settings unchanged", not changed,
                            "; ".join(changed) if changed else shown))
    return checks


def policy_acted(scrape: Scrape) -> list[Check]:
    """In dry_run the agent's policy may log what it would do (`dry_run` actions) and nothing else."""
    everything = [("", scrape.node), *((f"GPU {g} ", s) for g, s in scrape.gpus.items())]
    acted = {where + k: v for where, series in everything for k, v in series.items()
             if k.startswith("gpumond_policy_actions_total") and 'kind="dry_run"' not in k and v > 0}
    modes = [k for k, v in scrape.node.items() if k.startswith("gpumond_policy_mode") and v == 1]
    ok = not acted and modes == ['gpumond_policy_mode{mode="dry_run"}']
    return [Check("settings", "agent policy wrote nothing", ok,
                  f"modes {modes}; actions other than dry_run: {acted or 'none'}")]


def nvml_errors(scrape: Scrape) -> Check:
    """The NVML calls that failed and were retried (`gpumond_nvml_errors_total`), reported: a real driver may refuse
    what the simulator answers."""
    errors = {f"GPU {g} {k.split('{', 1)[1].rstrip('}')}": v for g, series in sorted(scrape.gpus.items())
              for k, v in series.items() if k.startswith("gpumond_nvml_errors_total{") and v > 0}
    return Check("driver", "NVML errors counted", None,
                 ", ".join(f"{k}: {v:g}" for k, v in errors.items()) or "none")


def driver_only(smi: Mapping[int, Mapping[str, str | None]]) -> str:
    """What nvidia-smi shows that the agent does not export (PCIe link, VBIOS, …), per GPU, for the result."""
    names = [f for f in REPORTED if f not in CLOCK_EVENTS and f != "driver_version"]
    return "; ".join(f"GPU {g}: " + ", ".join(f"{f}={row.get(f) or 'N/A'}" for f in names if f in row)
                     for g, row in sorted(smi.items()))


def not_compared(scrape: Scrape, fields: Sequence[Field] = FIELDS) -> list[str]:
    """The agent's per-GPU series no nvidia-smi --query-gpu field covers (GPM, NVLink, energy, thresholds, …)."""
    covered = {f.series.split("{")[0] for f in fields} | {"gpumond_gpu_info",
                                                           "gpumond_gpu_clocks_event_reasons_bitmask"}
    names = {k.split("{")[0] for series in scrape.gpus.values() for k in series}
    return sorted(names - covered)


# ----- GPM under the check's own loads ------------------------------------------------------------------------
GPM = {"util": "gpumond_gpu_utilization_ratio", "sm": "gpumond_gpu_sm_active_ratio",
       "occupancy": "gpumond_gpu_sm_occupancy_ratio", "tensor": 'gpumond_gpu_tensor_active_ratio{precision="any"}',
       "dram": "gpumond_gpu_dram_active_ratio"}
LOADS = ("idle", "tiny", "matmul")


def gpm_figures(scrapes: Sequence[Scrape], gpu: int) -> dict[str, float | None]:
    """Median of each GPM figure (and utilization) of one GPU over a load's scrapes; None where never exported."""
    out: dict[str, float | None] = {}
    for short, series in GPM.items():
        xs = [v for sc in scrapes if (v := sc.gpus.get(gpu, {}).get(series)) is not None]
        out[short] = _median(xs) if xs else None
    return out


def gpm_checks(figures: Mapping[str, Mapping[str, float | None]]) -> list[Check]:
    """The ordering the three loads must show (figures by load: idle, tiny, matmul)."""
    missing = sorted({f"{load}:{k}" for load in LOADS for k, v in figures.get(load, {}).items() if v is None}
                     | {f"{load}:all" for load in LOADS if load not in figures})
    if missing:
        return [Check("gpm", "GPM figures exported", False, "missing: " + ", ".join(missing))]
    idle, tiny, mm = (figures[x] for x in LOADS)

    def c(name: str, ok: bool, detail: str) -> Check:
        return Check("gpm", name, ok, detail)

    return [
        c("GPM figures exported", True, "SM activity, occupancy, tensor and DRAM activity under every load"),
        c("idle: SMs idle", idle["sm"] <= 0.05 and idle["tensor"] <= 0.02,  # type: ignore[operator]
          f"SM {idle['sm']:.3f} ≤ 0.05, tensor {idle['tensor']:.3f} ≤ 0.02"),
        c("tiny kernel: busy but doing little", tiny["util"] >= 0.5 and tiny["sm"] <= 0.2,  # type: ignore[operator]
          f"utilization {tiny['util']:.2f} ≥ 0.5 while SM activity {tiny['sm']:.3f} ≤ 0.2"),
        c("matmul: tensor pipes busy", mm["tensor"] >= max(idle["tensor"], tiny["tensor"]) + 0.2,  # type: ignore
          f"tensor {mm['tensor']:.3f} ≥ max(idle {idle['tensor']:.3f}, tiny {tiny['tensor']:.3f}) + 0.2"),
        c("matmul: more SMs active than the tiny kernel", mm["sm"] >= tiny["sm"] + 0.3,  # type: ignore[operator]
          f"SM {mm['sm']:.3f} ≥ tiny {tiny['sm']:.3f} + 0.3"),
        c("matmul: occupancy and DRAM above idle",
          mm["occupancy"] > idle["occupancy"] and mm["dram"] > idle["dram"],  # type: ignore[operator]
          f"occupancy {mm['occupancy']:.3f} > {idle['occupancy']:.3f}, DRAM {mm['dram']:.3f} > {idle['dram']:.3f}"),
    ]


def nvlink_check(scrape: Scrape, gpu: int) -> Check:
    """NVLink series present (how many links up), or absent with the reason the agent has for leaving them out."""
    series = scrape.gpus.get(gpu, {})
    links = {k: v for k, v in series.items() if k.startswith("gpumond_gpu_nvlink_up{")}
    if links:
        up = sum(1 for v in links.values() if v == 1)
        return Check("gpm", f"GPU {gpu} NVLink", None, f"{len(links)} links reported, {up} up; traffic series: "
                     f"{'yes' if any(k.startswith('gpumond_gpu_nvlink_bytes_per_second') for k in series) else 'no'}")
    return Check("gpm", f"GPU {gpu} NVLink", None,
                 "no NVLink series: the driver reports no links for this GPU (NVML_FI_DEV_NVLINK_LINK_COUNT 0 or "
                 "unsupported), as on a single-GPU machine without an NVLink bridge")


# ----- the job SDK and the whole path -------------------------------------------------------------------------
def separation_check(waits: Mapping[int, Sequence[float]], slow_rank: int,
                     name: str = "comm wait separates the slow rank") -> Check:
    """The slow rank waits least in the collective: its median exposed wait is below every other rank's."""
    if slow_rank not in waits or len(waits) < 2 or any(not w for w in waits.values()):
        return Check("job", name, False,
                     f"waits recorded per rank: { {r: len(w) for r, w in sorted(waits.items())} }")
    med = {r: _median(w) for r, w in waits.items()}
    others = [m for r, m in med.items() if r != slow_rank]
    ok = med[slow_rank] < min(others)
    return Check("job", name, ok,
                 "median exposed wait per rank (ms): " + ", ".join(
                     f"{'**' if r == slow_rank else ''}r{r} {m * 1e3:.2f}{'**' if r == slow_rank else ''}"
                     for r, m in sorted(med.items())) + f" over {min(len(w) for w in waits.values())}+ steps")


def findings_check(seen: Mapping[tuple[str, int | None, str], float], unexpected: Sequence[tuple[str, int | None, str]],
                   slow_rank: int) -> Check:
    """The rules service names the slow rank a straggler (firing), and nothing else."""
    fired = seen.get(("straggler", slow_rank, "firing"))
    ok = fired is not None and not unexpected
    return Check("path", f"findings name rank {slow_rank}", ok,
                 f"straggler on rank {slow_rank} firing after {fired} s" if fired is not None
                 else "no straggler finding on the slow rank"
                 + (f"; other findings: {', '.join(f'{k} r{r} {s}' for k, r, s in unexpected)}" if unexpected else ""))


def sync_check(with_sdk: Mapping[str, int], without: Mapping[str, int], steps: int) -> Check:
    """The SDK adds no host synchronisation: the CUDA runtime's synchronising calls, counted by the profiler over
    the same steps, are no more with instrument() than without."""
    names = sorted(set(with_sdk) | set(without))
    extra = {n: with_sdk.get(n, 0) - without.get(n, 0) for n in names if with_sdk.get(n, 0) > without.get(n, 0)}
    return Check("job", "no host synchronisation added", not extra,
                 f"over {steps} steps of rank 0, with / without instrument(): "
                 + (", ".join(f"{n} {with_sdk.get(n, 0)} / {without.get(n, 0)}" for n in names) or "no such calls"))


# ----- the result ---------------------------------------------------------------------------------------------
def checks_table(checks: Sequence[Check]) -> str:
    rows = ["| check | result | detail |", "| --- | --- | --- |"]
    for c in checks:
        mark = "—" if c.ok is None else ("ok" if c.ok else "**FAILED**")
        rows.append(f"| {c.name} | {mark} | {c.detail.replace('|', '/')} |")
    return "\n".join(rows)
