"""Config errors as one operator-facing line: file, dotted field path, problem."""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from gpumond.config.types import ConfigModel


class ConfigError(Exception):
    """A config file that cannot be used; `str()` is one line naming the file and the problem."""

    def __init__(self, source: str, problem: str) -> None:
        super().__init__(f"{source}: {problem}")
        self.source = source
        self.problem = problem


class FieldProblem(ValueError):
    """Raised by a validator of a whole mapping to name the field at fault, so the line can point at it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def format_validation_error(
    source: str, err: ValidationError, model: type[BaseModel] | None = None
) -> str:
    """Render a validation error as one line: `source: field.path: problem (+N more: …)`.

    Unknown keys get a "did you mean" hint from the validated model's fields; the model is
    found by the error's title among ConfigModel subclasses unless passed as `model`.
    """
    return f"{source}: {validation_problem(err, model)}"


def more_problems(n: int) -> str:
    """' (+N more: fix this one and check again)', or '' for none: a one-line error names the first problem,
    and says there are others so that fixing it is not taken for the end."""
    return f" (+{n} more: fix this one and check again)" if n > 0 else ""


def counted(n: int) -> str:
    """' (+N more)', or '' for none: the terse count for an answer a program reads (the push API's 422 body)."""
    return f" (+{n} more)" if n > 0 else ""


def validation_problem(err: ValidationError, model: type[BaseModel] | None = None, *,
                       more: Callable[[int], str] = more_problems) -> str:
    """The first problem of a validation error as `field.path: problem`, then `more` of how many others."""
    errors = err.errors(include_url=False)
    model = model or _model_named(err.title)
    if not errors:
        return "invalid configuration"
    return _describe(errors[0], model) + more(len(errors) - 1)


def _describe(error: ErrorDetails, model: type[BaseModel] | None) -> str:
    cause = error.get("ctx", {}).get("error")
    if isinstance(cause, FieldProblem):  # the whole mapping was checked; the problem is one of its fields
        return f"{_dotted_path((*error['loc'], cause.field))}: {cause}"
    path = _dotted_path(error["loc"])
    problem = _problem(error, model)
    return f"{path}: {problem}" if path else problem


def _dotted_path(loc: tuple[int | str, ...]) -> str:
    """`("jobs", "env_vars", 0)` -> `jobs.env_vars[0]`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


# pydantic error type -> (context key holding the bound, sentence).
_BOUNDS = {
    "greater_than": ("gt", "must be greater than {}"),
    "greater_than_equal": ("ge", "must be at least {}"),
    "less_than": ("lt", "must be less than {}"),
    "less_than_equal": ("le", "must be at most {}"),
}


def _problem(error: ErrorDetails, model: type[BaseModel] | None) -> str:
    kind, ctx, value = error["type"], error.get("ctx", {}), error.get("input")
    if kind == "extra_forbidden":
        return "unknown key" + _suggestion(error["loc"], model)
    if kind == "missing":
        return "required key is missing"
    if kind in _BOUNDS:
        key, sentence = _BOUNDS[kind]
        text = sentence.format(_number(ctx[key]))
    elif kind == "literal_error":
        text = f"must be one of {ctx['expected']}"
        quoted = _unquoted_yaml_word(value, ctx["expected"])
        if quoted:
            return f"{text} (got {_show(value)}: YAML reads an unquoted {quoted} as {_show(value)}; quote it: \"{quoted}\")"
    elif kind.endswith(("too_short", "too_long")):
        text = _length(kind, ctx)
    elif kind in ("tuple_type", "list_type"):
        text = "must be a list"
    elif kind in ("model_type", "model_attributes_type", "dict_type"):
        text = "must be a mapping of keys"
    elif kind == "value_error":
        text = str(ctx.get("error", error["msg"]))
    else:
        text = _reword(error["msg"])
    return f"{text} (got {_show(value)})"


# YAML 1.1 (PyYAML) turns these bare words into booleans, so `mode: off` arrives as false.
_YAML_BOOL_WORDS = {False: ("off", "no"), True: ("on", "yes")}


def _unquoted_yaml_word(value: Any, expected: str) -> str | None:
    """The allowed word a boolean must have been written as, unquoted; None when it was not one."""
    if not isinstance(value, bool):
        return None
    allowed = re.findall(r"'([^']*)'", expected)
    return next((word for word in _YAML_BOOL_WORDS[value] if word in allowed), None)


def _length(kind: str, ctx: dict[str, Any]) -> str:
    unit = "characters" if kind.startswith("string") else "items"
    if kind.endswith("too_long"):
        return f"must have at most {ctx['max_length']} {unit}"
    limit = ctx["min_length"]
    return "must not be empty" if limit == 1 else f"must have at least {limit} {unit}"


def _reword(msg: str) -> str:
    # pydantic says "Input should be a valid boolean"; the line already names the field.
    if msg.startswith("Input should "):
        return "must " + msg.removeprefix("Input should ")
    return msg[:1].lower() + msg[1:]


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _show(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else _yaml_scalar(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _yaml_scalar(value: Any) -> str:
    # Show values the way the operator wrote them in YAML, not as Python reprs.
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return _number(value)
    return str(value)


def _suggestion(loc: tuple[int | str, ...], model: type[BaseModel] | None) -> str:
    known = _known_keys(loc[:-1], model)
    if not known or not isinstance(loc[-1], str):
        return ""
    close = difflib.get_close_matches(loc[-1], known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _model_named(title: str) -> type[BaseModel] | None:
    pending: list[type[BaseModel]] = [ConfigModel]
    while pending:
        cls = pending.pop()
        if cls.__name__ == title:
            return cls
        pending.extend(cls.__subclasses__())
    return None


def _known_keys(parent: tuple[int | str, ...], model: type[BaseModel] | None) -> list[str]:
    annotation: Any = model
    for part in parent:
        annotation = _child(annotation, part)
    found = _as_model(annotation)
    return list(found.model_fields) if found else []


def _child(annotation: Any, part: int | str) -> Any:
    """The annotation one location step below: a model's field, or a container's element."""
    model = _as_model(annotation)
    if model is not None:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        return field.annotation if field else None
    # list[X] / tuple[X, ...] / dict[K, X]: the element type is the last argument.
    args = [a for a in typing.get_args(_strip(annotation)) if a is not Ellipsis]
    return args[-1] if args else None


def _as_model(annotation: Any) -> type[BaseModel] | None:
    annotation = _strip(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _strip(annotation: Any) -> Any:
    """Remove `Annotated[...]` and `| None` wrappers."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(args) != 1:
                return annotation
            annotation = args[0]
        else:
            return annotation
