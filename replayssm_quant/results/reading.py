"""Shared pieces of the result loaders: JSON files, numbers that may be null, the SSM shape
block. Private to the loaders of this package."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..precision import ModelShape
from .errors import ResultsError


def num(value: Any) -> float:
    """A JSON number as float; ``null`` is NaN (the writers store NaN as null)."""
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(type(value).__name__)
    return float(value)


def shape_from(meta: Any, model: str, where: str, problems: list[str]) -> ModelShape | None:
    if meta is None:
        return None
    if not isinstance(meta, dict):
        problems.append(f"{where}: 'ssm_shape' must be an object")
        return None
    try:
        return ModelShape(
            name=model, kind=str(meta["kind"]), heads=int(meta["heads"]),
            head_dim=int(meta["head_dim"]), d_state=int(meta["d_state"]),
            groups=int(meta["groups"]),
            layers=int(meta["layers"]) if meta.get("layers") is not None else None,
            act_bytes=int(meta.get("act_bytes", 2)),
        )
    except KeyError as e:
        problems.append(f"{where}: 'ssm_shape' lacks {e.args[0]!r}")
    except (TypeError, ValueError) as e:
        problems.append(f"{where}: 'ssm_shape' is invalid: {e}")
    return None


def read_json(path: Path) -> dict:
    try:
        text = path.read_text()
    except OSError as e:
        raise ResultsError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ResultsError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None
    if not isinstance(obj, dict):
        raise ResultsError(f"{path}: the top level must be a JSON object")
    return obj


def opt_int(obj: dict, key: str, where: str, problems: list[str]) -> int | None:
    v = obj.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        problems.append(f"{where}: {key!r} must be an integer, got {v!r}")
        return None
    return v



def list_or_empty(value: Any, problem: str, problems: list[str]) -> list:
    """``value`` when it is a list; else ``[]``, with ``problem`` recorded (the loader goes on,
    so every problem of a file is reported at once)."""
    if isinstance(value, list):
        return value
    problems.append(problem)
    return []
