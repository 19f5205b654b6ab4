"""A push's steps as columns, from either encoding, and the rules on their values checked on whole columns.

The JSON encoding's types and per-field bounds are checked by pydantic as it parses; what pydantic cannot
say (a wait within its step) and, for the columnar encoding, everything about the values is checked here
with one numpy expression per rule, so a push costs no Python object per step. Either way a refusal names
the step by its place in the push, `steps[3].duration_s: …`, with the same words.
"""

from __future__ import annotations

import binascii
import functools
import math
from collections.abc import Sequence

import numpy as np

from gpumond.push.values import StepColumns, StepRecord
from gpumond.wire.media import COLUMN_FIELDS, FLOAT_FIELDS

MAX_STEP_DURATION_S = 86_400.0  # a step longer than a day is a unit mistake, not a slow step
WAIT_SLACK_S = 1e-6  # waits and duration come from separate clock reads; allow their rounding
_LE_I8 = np.dtype("<i8")
_LE_F8 = np.dtype("<f8")


class StepsError(ValueError):
    """A push's steps break a rule; the message is one line naming the step and field."""


def step_rows(steps: Sequence[StepRecord]) -> tuple[np.ndarray, np.ndarray]:
    """(step numbers as int64, (4, n) float64 of end, duration_s, data_wait_s, comm_wait_s with NaN for None).
    Raises OverflowError for a step number outside int64."""
    numbers = np.array([s.step for s in steps], dtype=np.int64)
    values = np.array([(s.end, s.duration_s, s.data_wait_s, s.comm_wait_s) for s in steps], dtype=float)
    return numbers, values.reshape(-1, 4).T


def step_samples(steps: Sequence[StepRecord]) -> np.ndarray:
    """Each step's samples as int64, -1 where not reported."""
    return np.array([-1 if s.samples is None else s.samples for s in steps], dtype=np.int64)



def from_records(steps: Sequence[StepRecord]) -> StepColumns:
    """The JSON encoding's validated records as columns (step numbers are within int64 by then)."""
    numbers, values = step_rows(steps)
    return StepColumns(numbers, np.ascontiguousarray(values), step_samples(steps))


def decode(columns: dict[str, str | None], max_steps: int) -> StepColumns:
    """The columnar encoding's base64 arrays as StepColumns, every value checked (StepsError names the first)."""
    cols = read_columns(columns, max_steps)
    if len(cols) and not plainly_valid(cols):
        _name_the_first_problem(cols, cols.samples)
    return cols


def read_columns(columns: dict[str, str | None], max_steps: int) -> StepColumns:
    """The columnar encoding's base64 arrays as StepColumns, their lengths checked but not their values (StepsError
    names the first bad column); `decode` checks the values of one push, `slice_problems` those of a batch's."""
    raw: dict[str, bytes] = {}
    for name, required in COLUMN_FIELDS:  # a refusal names the first bad column in this order
        text = columns.get(name)
        if text is None:
            if required:
                raise StepsError(f"columns.{name}: required key is missing")
            continue
        if not isinstance(text, str):
            raise StepsError(f"columns.{name}: must be a base64 string")
        try:
            data = binascii.a2b_base64(text, strict_mode=True)
        except (binascii.Error, ValueError):
            raise StepsError(f"columns.{name}: must be standard base64 with padding") from None
        if len(data) % 8:
            raise StepsError(f"columns.{name}: must hold 8-byte values (got {len(data)} bytes)")
        raw[name] = data
    n = len(raw["step"]) // 8
    if n > max_steps:
        raise StepsError(f"columns: must have at most {max_steps} steps (got {n})")
    for name, data in raw.items():
        if len(data) != 8 * n:
            raise StepsError(f"columns.{name}: must hold as many values as columns.step ({n}) (got {len(data) // 8})")
    # The integer columns as one (1 or 2, n) array and the four float ones as one (4, n) array, one copy each, so
    # that each rule is one numpy call over all of a push's values. A missing comm wait is NaN (not measured).
    samples = raw.get("samples")
    ints = np.frombuffer(raw["step"] + samples if samples is not None else raw["step"], dtype=_LE_I8)
    ints = ints.astype(np.int64, copy=False).reshape(1 if samples is None else 2, n)
    comm = raw.get("comm_wait_s")
    values = np.frombuffer(b"".join((raw["end"], raw["duration_s"], raw["data_wait_s"], comm or _nans(n))),
                           dtype=_LE_F8)
    values = values.astype(np.float64, copy=False).reshape(4, n)
    return StepColumns(ints[0], values, ints[1] if samples is not None else None)


def slice_problems(cols: StepColumns, bounds: Sequence[int]) -> dict[int, str]:
    """A batch's steps cut at `bounds` (push i holds cols[bounds[i]:bounds[i + 1]]): each push breaking a rule, with
    the one line its first problem would have had pushed alone (`steps[i]` counted within that push). All the rules
    are checked once over the whole batch; only a batch that breaks one is looked at push by push."""
    if not len(cols) or plainly_valid(cols):
        return {}
    problems = {}
    for i in range(len(bounds) - 1):
        part = cut(cols, bounds[i], bounds[i + 1])
        if len(part) and not plainly_valid(part):
            try:
                _name_the_first_problem(part, part.samples)
            except StepsError as err:
                problems[i] = str(err)
    return problems


def cut(cols: StepColumns, start: int, stop: int) -> StepColumns:
    """The steps start..stop of `cols` as their own StepColumns (views, no copy)."""
    samples = cols.samples
    return StepColumns(cols.step[start:stop], cols.values[:, start:stop],
                       None if samples is None else samples[start:stop])


@functools.lru_cache(maxsize=8)
def _nans(n: int) -> bytes:
    """n float64 NaNs: the comm-wait row of a push that did not measure it (a few sizes recur: SDK batches)."""
    return np.full(n, np.nan, dtype=_LE_F8).tobytes()


def plainly_valid(cols: StepColumns) -> bool:
    """Every rule at once, the waits' included, in as few whole-array operations as it takes (a push's cost is
    mostly numpy's per-call overhead: 64 values each). NaN fails every comparison (min/max propagate it); a NaN
    comm wait is "not measured" and passes."""
    if cols.step.min() < 0 or (cols.samples is not None and cols.samples.min() < -1):
        return False
    values = cols.values
    end_lo, duration_lo, wait_lo, _ = values.min(axis=1).tolist()
    end_hi, duration_hi, _, _ = values.max(axis=1).tolist()
    if not (end_lo >= 0 and duration_lo >= 0 and wait_lo >= 0 and end_hi < math.inf
            and duration_hi <= MAX_STEP_DURATION_S):
        return False
    wait = values[2]
    most = values[1] + WAIT_SLACK_S
    if not (wait - most).max() <= 0:  # the wait within its step; finite values, so as `wait <= most` says it
        return False
    comm = values[3]
    # fmin/fmax skip NaN (not measured); an infinity fails one of the two
    return not (np.fmin.reduce(comm) < 0 or np.fmax.reduce((comm + wait) - most) > 0)


def _name_the_first_problem(cols: StepColumns, samples: np.ndarray | None) -> None:
    """Raise StepsError for the first value that breaks a rule, in field order (only for a refused push)."""
    values = cols.values
    _at_least_zero(cols.step, "step")
    if samples is not None:
        _at_least(samples, -1, "samples", "at least 0, or -1 for none")
    bad = ~np.isfinite(values[:3])
    if bad.any():
        row, i = _first(bad)
        raise StepsError(f"steps[{i}].{FLOAT_FIELDS[row][0]}: must be a finite number")
    comm = values[3]
    if np.isinf(comm).any():  # NaN says "not measured"; an infinity is a mistake
        raise StepsError(f"steps[{_first_index(np.isinf(comm))}].comm_wait_s: must be a finite number, or NaN for "
                         "not measured")
    _at_least_zero(values[0], "end")
    _at_least_zero(values[1], "duration_s")
    over = values[1] > MAX_STEP_DURATION_S
    if over.any():
        i = _first_index(over)
        raise StepsError(f"steps[{i}].duration_s: must be at most {MAX_STEP_DURATION_S:g} (got {values[1, i]:g})")
    _at_least_zero(values[2], "data_wait_s")
    _at_least_zero(np.where(np.isnan(comm), 0.0, comm), "comm_wait_s", comm)
    check_waits(cols)
    raise AssertionError("plainly_valid refused a push no rule refuses")  # pragma: no cover


def check_waits(cols: StepColumns) -> None:
    """Both waits lie within their step: data_wait_s <= duration_s and, when comm wait was measured,
    data_wait_s + comm_wait_s <= duration_s (each +1 µs for clock rounding). The data wait is named first."""
    duration, wait, comm = cols.values[1], cols.values[2], cols.values[3]
    most = duration + WAIT_SLACK_S
    bad_wait = wait > most
    bad_comm = (comm + wait) > most  # False where comm is NaN (not measured)
    if not (bad_wait.any() or bad_comm.any()):
        return
    i = _first_index(bad_wait | bad_comm)
    d, w, c = float(duration[i]), float(wait[i]), float(comm[i])
    if bad_wait[i]:
        raise StepsError(f"steps[{i}].data_wait_s: must be at most duration_s ({d:g}) (got {w:g})")
    if c > d + WAIT_SLACK_S:
        raise StepsError(f"steps[{i}].comm_wait_s: must be at most duration_s ({d:g}) (got {c:g})")
    raise StepsError(f"steps[{i}].comm_wait_s: must be at most duration_s - data_wait_s ({d - w:g}) (got {c:g})")


def _at_least_zero(a: np.ndarray, name: str, shown: np.ndarray | None = None) -> None:
    _at_least(a, 0, name, "at least 0", shown)


def _at_least(a: np.ndarray, low: float, name: str, words: str, shown: np.ndarray | None = None) -> None:
    low_mask = a < low
    if low_mask.any():
        i = _first_index(low_mask)
        got = (shown if shown is not None else a)[i]
        raise StepsError(f"steps[{i}].{name}: must be {words} (got {got.item():g})")


def _first_index(mask: np.ndarray) -> int:
    return int(np.argmax(mask))


def _first(mask: np.ndarray) -> tuple[int, int]:
    """(row, column) of the first True by column (the earliest step), then by row (the field order)."""
    column = int(np.argmax(mask.any(axis=0)))
    return int(np.argmax(mask[:, column])), column
