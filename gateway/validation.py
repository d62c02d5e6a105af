"""Validation building blocks shared by the policy, the wire models and the tools: strict
models, durations with units, and problems located by path (``tiers.fast[1]``)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, PlainValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: Any) -> Any:
    """Accept seconds as a number or a string with a unit: ``150ms``, ``2s``, ``1.5m``, ``1h``, ``2d``."""
    if isinstance(value, str):
        match = _DURATION.match(value)
        if not match:
            raise ValueError(f"not a duration: {value!r} (use seconds, or a number with ms, s, m, h or d)")
        return float(match.group(1)) * _UNIT_S[match.group(2)]
    return value


Seconds = Annotated[float, BeforeValidator(parse_duration)]
"""A duration in seconds; YAML may write ``2s`` or ``150ms``."""

_POLICY_DIR: ContextVar[Path | None] = ContextVar("policy_dir", default=None)


@contextmanager
def files_relative_to(folder: Path) -> Iterator[None]:
    """While a policy file is validated, the files it names are read relative to its folder."""
    token = _POLICY_DIR.set(folder)
    try:
        yield
    finally:
        _POLICY_DIR.reset(token)


def policy_file(path: str) -> str:
    """A file a policy names (weights, an index), resolved against the policy file's folder, so
    the policy works from any working directory; absolute paths, and policies validated from
    text rather than a file, keep the path as written."""
    folder = _POLICY_DIR.get()
    if folder is None or Path(path).is_absolute():
        return path
    return str(folder / path)


class StrictModel(BaseModel):
    """Policy sections reject unknown keys (a typo must not be silently ignored) and are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Issue(BaseModel):
    """One problem found in a policy: where (``loc``, and the file's line when known) and what."""

    loc: tuple[int | str, ...]
    message: str
    line: int | None = None

    @property
    def path(self) -> str:
        return format_loc(self.loc)

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line else ""
        return f"{where}{self.path or '(top level)'}: {self.message}"


def format_loc(loc: tuple[int | str, ...]) -> str:
    """``('tiers', 'fast', 1)`` -> ``tiers.fast[1]``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def one_of(names: Sequence[str]) -> tuple[PlainValidator, WithJsonSchema]:
    """Metadata for ``Annotated[str, *one_of(names)]``: a string from a table that lives in
    code (a registry), checked and reported like a ``Literal`` of those names."""

    def check(value: Any) -> str:
        if isinstance(value, str) and value in names:
            return value
        shown = [repr(name) for name in names]
        expected = shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"
        raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})

    return PlainValidator(check), WithJsonSchema({"type": "string", "enum": list(names)})
