"""Loader of task evaluation folders (``replayssm-quant eval``): one ``summary.json`` validated
into a :class:`~replayssm_quant.results.model.TaskResults` per model, every config string parsed
once."""

from __future__ import annotations

import math
from pathlib import Path

from ..precision import ModelShape, PrecisionConfig, parse_config
from .errors import ResultsError
from .model import TASK_REQUIRED_FIELDS, Issue, TaskResults, TaskRow
from .reading import num, opt_int, read_json, shape_from

__all__ = ["load_tasks"]

_TASK_CORE = ("accuracy", "delta", "delta_lo")
"""Task metrics that are finite in any sound run: a NaN here is an :class:`Issue`."""


def _task_rows(obj: dict, file: Path) -> dict[str, TaskResults]:
    where = str(file)
    problems: list[str] = []
    top_model = obj.get("model")
    if top_model is not None and (not isinstance(top_model, str) or not top_model):
        problems.append(f"{where}: 'model' must be a non-empty string")
        top_model = None
    ref = obj.get("reference", "fp32")
    if not isinstance(ref, str):
        problems.append(f"{where}: 'reference' must be a config name or string")
        ref = "fp32"
    try:
        ref_key: PrecisionConfig | str = parse_config(ref)
    except ValueError as e:
        problems.append(f"{where}: reference {ref!r} does not parse: {e}")
        ref_key = ref
    items: dict[str, int] = {}
    for i, t in enumerate(obj.get("tasks") or []):
        if not isinstance(t, dict) or not isinstance(t.get("task"), str):
            problems.append(f"{where}: tasks[{i}] must be an object with a 'task' name")
            continue
        if t.get("items") is not None:
            if isinstance(t["items"], bool) or not isinstance(t["items"], int):
                problems.append(f"{where}: tasks[{i}].items must be an integer")
            elif t.get("limit") is None:
                # with a limit, lm-eval's per-subtask cut makes the expected count unknowable
                # from the full count; completeness is then checked across configs only
                items[t["task"]] = t["items"]
    rows_raw = obj.get("results")
    if not isinstance(rows_raw, list) or not rows_raw:
        problems.append(f"{where}: 'results' must be a non-empty list")
        rows_raw = []
    by_model: dict[str, list[TaskRow]] = {}
    issues: dict[str, list[Issue]] = {}
    seen: set[tuple[str, str, PrecisionConfig]] = set()
    for i, r in enumerate(rows_raw):
        rw = f"{where}: results[{i}]"
        if not isinstance(r, dict):
            problems.append(f"{rw}: must be an object")
            continue
        missing = [k for k in TASK_REQUIRED_FIELDS if k not in r]
        if missing:
            problems.append(f"{rw}: lacks {', '.join(repr(k) for k in missing)}")
            continue
        model = r.get("model", top_model)
        if not isinstance(model, str) or not model:
            problems.append(f"{rw}: no model (give 'model' at the top level or in the row)")
            continue
        task = r["task"]
        if not isinstance(task, str) or not task:
            problems.append(f"{rw}: 'task' must be a non-empty string")
            continue
        try:
            canon = parse_config(r["config"])
        except (ValueError, TypeError) as e:
            problems.append(f"{rw}: config {r['config']!r} does not parse: {e}")
            continue
        name = r.get("name") if isinstance(r.get("name"), str) and r.get("name") else str(canon)
        rw = f"{where}: model {model!r} task {task!r} config {name!r}"
        if (model, task, canon) in seen:
            problems.append(f"{rw}: appears twice")
            continue
        seen.add((model, task, canon))
        values: dict[str, float] = {}
        bad = False
        method = r.get("delta_ci_method")
        if method is not None and not isinstance(method, str):
            problems.append(f"{rw}: 'delta_ci_method' must be a string or null, got {method!r}")
            bad = True
        for k, v in r.items():
            if k in ("model", "task", "name", "config", "delta_ci_method"):
                continue
            try:
                values[k] = num(v)
            except TypeError as e:
                problems.append(f"{rw}: {k!r} must be a number or null, got {e}")
                bad = True
        if bad:
            continue
        n = values["n"]
        if not math.isfinite(n) or n != int(n) or n < 0:
            problems.append(f"{rw}: 'n' must be a non-negative integer")
            continue
        row = TaskRow(task=task, name=name, config=canon, n=int(n),
                      **{k: values[k] for k in TASK_REQUIRED_FIELDS[3:]}, values=values,
                      delta_ci_method=method)
        by_model.setdefault(model, []).append(row)
        iss = issues.setdefault(model, [])
        nan = [k for k in _TASK_CORE if not math.isfinite(values[k])]
        if canon == ref_key:
            nan = [k for k in nan if k == "accuracy"]
        if nan:
            iss.append(Issue("nan", rw, f"{', '.join(nan)} is NaN or infinite", canon, task))
        if task in items and row.n < items[task]:
            iss.append(Issue("partial", rw, f"{row.n} of {items[task]} items scored", canon,
                             task))
        elif task in items and row.n > items[task]:
            problems.append(f"{rw}: {row.n} items scored but the task has {items[task]}")
    shape = shape_from(obj.get("ssm_shape"), top_model or "?", where, problems)
    seed = opt_int(obj, "seed", where, problems)
    if problems:
        raise ResultsError(problems)
    out: dict[str, TaskResults] = {}
    for model, rows in by_model.items():
        iss = issues.get(model, [])
        for task in dict.fromkeys(r.task for r in rows):
            trows = [r for r in rows if r.task == task]
            full = max(r.n for r in trows)
            for r in trows:
                if r.n < full and task not in items:  # else flagged against "items" above
                    iss.append(Issue(
                        "partial", f"{where}: model {model!r} task {task!r} config {r.name!r}",
                        f"{r.n} items scored, another config of the task {full}", r.config,
                        task))
        out[model] = TaskResults(
            path=file.parent, model=model, reference=ref_key,
            shape=(ModelShape(model, shape.kind, shape.heads, shape.head_dim, shape.d_state,
                              shape.groups, shape.layers, shape.act_bytes) if shape else None),
            seed=seed, items=items, rows=tuple(rows), issues=tuple(iss), raw=obj)
    return out


def load_tasks(path: str | Path, raw: dict | None = None) -> dict[str, TaskResults]:
    """Validate a task folder (or its ``summary.json``): one :class:`TaskResults` per model."""
    p = Path(path)
    file = p / "summary.json" if p.is_dir() else p
    return _task_rows(raw if raw is not None else read_json(file), file)


