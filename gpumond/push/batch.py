"""The columnar batch (gpumond/wire/batch.py) judged: its framing once, each push's head alone, and every step
value once for the whole batch, so a batch costs one JSON parse, a head check per push and a few numpy calls.

Each push comes out as a single push would from `parse` (a PushBody with its steps), or as the PayloadError it
would have had alone: a bad head or a bad step refuses its own push only. What concerns the batch whole (not
JSON, arrays of different lengths, step counts that do not add up to the columns) is a BatchError.
"""

from __future__ import annotations

import functools
import itertools
import json

import numpy as np
from pydantic import ValidationError

from gpumond.push.body import PayloadError, PushBody, describe
from gpumond.push.steps import StepsError, cut, read_columns, slice_problems
from gpumond.push.values import StepColumns
from gpumond.wire.batch import MAX_BATCH_PUSHES, PUSH_KEYS, BatchError

_HEAD_KEYS = tuple(name for name, _ in PUSH_KEYS if name != "steps")
# A relay sends the same heads every interval; judged once, remembered (an entry is under 1 KiB, far less than the
# steps the store holds per rank). Bounded, so heads made up by a hostile client cannot grow it without end.
MAX_REMEMBERED_HEADS = 65_536
Judged = tuple[PushBody, StepColumns] | PayloadError


class HeadJudge:
    """A push's head judged by the push model's own rules (body.head_model), the judgement remembered per head."""

    def __init__(self, model: type[PushBody], remembered: int = MAX_REMEMBERED_HEADS) -> None:
        self.model = model
        self._cached = functools.lru_cache(maxsize=remembered)(self._judge)

    def __call__(self, head: tuple[object, ...]) -> PushBody | PayloadError:
        """`head`: the values of _HEAD_KEYS with the job first. Only a head whose numbers and flag have their JSON
        types is looked up: 1, 1.0 and True are equal keys in a dict, but only 1 is a rank."""
        _, rank, world_size, *_, final = head
        if type(rank) is int and type(world_size) is int and (final is None or type(final) is bool):
            try:
                return self._cached(head)
            except TypeError:  # an array or object where a value belongs: unhashable, judged (and refused) below
                pass
        return self._judge(head)

    def _judge(self, head: tuple[object, ...]) -> PushBody | PayloadError:
        fields = {name: value for name, value in zip(("job", *_HEAD_KEYS), head) if value is not None}
        try:
            return self.model.model_validate(fields)
        except ValidationError as err:
            return PayloadError(*describe(err, self.model))


class ColumnsBatchError(BatchError):
    """The columnar batch is wrong as a whole; `status` 400 (not JSON) or 422."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


def parse_columns_batch(body: bytes, judge: HeadJudge, max_steps: int,
                        max_pushes: int = MAX_BATCH_PUSHES) -> tuple[str, list[Judged], np.ndarray]:
    """(job, each push judged, in order: its head and steps, or its refusal, and every step's end) of a columnar
    batch; `judge`: over body.head_model with the configured limits, `max_steps`: limits.max_steps_per_push. Raises
    ColumnsBatchError for the batch's framing."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise ColumnsBatchError(f"invalid JSON: {err}", 400) from None
    if not isinstance(doc, dict):
        raise ColumnsBatchError('body: must be a JSON object {"job": …, "pushes": {…}, "columns": {…}}')
    job, pushes, columns = doc.get("job"), doc.get("pushes"), doc.get("columns")
    if not isinstance(job, str) or not job:
        raise ColumnsBatchError("job: must be a non-empty string")
    if not isinstance(pushes, dict):
        raise ColumnsBatchError("pushes: must be a JSON object of arrays, one value per push")
    if not isinstance(columns, dict):
        raise ColumnsBatchError("columns: must be a JSON object of base64 arrays")
    arrays = _arrays(pushes, max_pushes)
    counts = arrays["steps"]
    if not all(type(n) is int and n >= 0 for n in counts):
        raise ColumnsBatchError("pushes.steps: must be integers >= 0, each push's count of step values")
    bounds = [0, *itertools.accumulate(counts)]  # Python ints: a count past int64 is refused below, not wrapped
    try:
        steps = read_columns(columns, bounds[-1])
    except StepsError as err:
        raise ColumnsBatchError(str(err)) from None
    if len(steps) != bounds[-1]:
        raise ColumnsBatchError(f"pushes.steps: add up to {bounds[-1]} but the columns hold {len(steps)} values")
    problems = slice_problems(steps, bounds)
    out: list[Judged] = []
    heads = zip(*(arrays[name] for name in _HEAD_KEYS))
    for i, (n, values) in enumerate(zip(counts, heads)):
        push = judge((job, *values))
        if isinstance(push, PayloadError):
            out.append(push)
        elif n > max_steps:
            out.append(PayloadError(422, f"columns: must have at most {max_steps} steps (got {n})"))
        elif i in problems:
            out.append(PayloadError(422, problems[i]))
        else:
            out.append((push, cut(steps, bounds[i], bounds[i + 1])))
    return job, out, steps.end


def _arrays(pushes: dict[str, object], max_pushes: int) -> dict[str, list[object]]:
    """The head's arrays by key (a missing optional one: None for every push), all of one length."""
    arrays: dict[str, list[object]] = {}
    length = None
    for name, required in PUSH_KEYS:
        values = pushes.get(name)
        if values is None and not required:
            continue
        if not isinstance(values, list):
            raise ColumnsBatchError(f"pushes.{name}: " + ("must be an array, one value per push" if values is not None
                                                          else "required key is missing"))
        if length is None:
            length = len(values)
            if length > max_pushes:
                raise ColumnsBatchError(f"pushes: must hold at most {max_pushes} pushes (got {length})")
        elif len(values) != length:
            raise ColumnsBatchError(f"pushes.{name}: must hold one value per push ({length}) (got {len(values)})")
        arrays[name] = values
    n = length or 0
    for name in _HEAD_KEYS:
        arrays.setdefault(name, [None] * n)
    return arrays
