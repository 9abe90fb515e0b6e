"""Loaders for result folders: drift (``replayssm-quant drift``) and task evaluations
(``replayssm-quant eval``), validated into typed records.

The recommender, the reports and the CI gate all read results through this module, so the
writers and the readers agree on one schema and a malformed folder fails with one message per
problem instead of a ``KeyError`` deep inside a report.

A result folder holds a ``summary.json``; a folder of several models holds one subfolder per
model. Numbers are JSON numbers; a ``null`` is read as NaN (the writers store NaN as ``null``).
Rates and accuracies are fractions in [0, 1]; accuracy deltas are fractions too
(``-0.01`` = one point lower).

Drift ``summary.json`` (written by :mod:`replayssm_quant.evals.drift`)::

    {"model": str, "model_type": str, "data": str, "seed": int, "prefill": int,
     "max_tokens": int, "tokens": int, "positions_per_config": int, "reference": str,
     "ssm_shape": {"kind": "mamba2"|"gdn", "heads", "head_dim", "d_state", "groups",
                   "layers", ["act_bytes"]},
     "buckets": [{"bucket": "[lo,hi)", "lo": int, "hi": int}, ...],   # log-spaced, ascending
     "configs": [{"name": label, "config": "ckpt=..,read=..,L=..",
                  "overall": STATS, "buckets": [{"bucket", "lo", "hi"} | STATS, ...]}, ...],
     "decay_spectrum": {"layers": [{"layer", "kind", "mean_decay": [...],
                                    "memory_tokens": [...], ...}],
                        "heads": int, "fraction_of_heads": {">=0.99": f, ...},
                        "max_mean_decay": f},
     "documents": [...], "device": str, "dtype": str, "versions": {...}}

    STATS: n, kl_mean, kl_ci_lo, kl_ci_hi, kl_median, kl_p90, kl_p99, kl_max, same_top1,
           ppl_ratio (required keys) and kl_se, kl_p95, kl_p99_9, same_top1_lo, same_top1_hi,
           dp_mean, dp_rms, ppl_ref, ppl, ppl_ratio_lo, ppl_ratio_hi (optional)

Task ``summary.json`` (written by ``replayssm-quant eval``)::

    {"kind": "tasks", "schema_version": 1,
     "model": str,                        # default for rows without their own "model"
     "reference": "fp32",                 # config (name or string) the deltas are paired against
     "ssm_shape": {...},                  # optional, as in drift
     "seed": int,                         # optional
     "tasks": [{"task": str, "items": int, "limit": int|float|null,
                "max_gen_toks": int}, ...],   # optional; "items" is the item count a
                                          # complete run scores (not checked when "limit"
                                          # is set: then only equal counts across configs)
     "results": [{"model": str (optional), "task": str, "name": label, "config": str,
                  "n": int, "accuracy": f, "accuracy_lo": f, "accuracy_hi": f,
                  "delta": f, "delta_lo": f, "delta_hi": f,     # paired bootstrap vs reference
                  "mcnemar_p": f, "flip_rate": f, "truncation_rate": f,
                  "invalid_rate": f}, ...]}

Other keys are allowed (the writers add provenance); extra fields of a STATS block or a task
row must be numbers or null. A summary may say what it is with ``"kind": "drift"`` or
``"kind": "tasks"``; without it the kind is read from the keys.

Problems with the content rather than the form (a NaN metric, a config with fewer positions
or items than the run should have, a config missing from a bucket) do not raise: they are kept
as :class:`Issue` records on the result, so the gate can fail closed on them and the
recommender can reject the affected configs with a reason.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..precision import ModelShape, parse_config

__all__ = [
    "DRIFT_REQUIRED_STATS",
    "TASK_REQUIRED_FIELDS",
    "BucketSpec",
    "DriftConfig",
    "DriftResults",
    "DriftStats",
    "Issue",
    "ModelResults",
    "ResultSet",
    "ResultsError",
    "TaskResults",
    "TaskRow",
    "config_key",
    "load_drift",
    "load_results",
    "load_tasks",
]

DRIFT_REQUIRED_STATS: tuple[str, ...] = (
    "n", "kl_mean", "kl_ci_lo", "kl_ci_hi", "kl_median", "kl_p90", "kl_p99", "kl_max",
    "same_top1", "ppl_ratio",
)
"""Keys every drift STATS block must have (values may be ``null``)."""

_DRIFT_CORE = ("kl_mean", "same_top1", "ppl_ratio")
"""Drift metrics that are finite in any sound run: a NaN here is an :class:`Issue`."""

TASK_REQUIRED_FIELDS: tuple[str, ...] = (
    "task", "config", "n", "accuracy", "accuracy_lo", "accuracy_hi", "delta", "delta_lo",
    "delta_hi", "mcnemar_p", "flip_rate", "truncation_rate", "invalid_rate",
)
"""Keys every task result row must have (values other than ``task``/``config`` may be null)."""

_TASK_CORE = ("accuracy", "delta", "delta_lo")

ISSUE_KINDS = ("missing", "nan", "partial", "mismatched")


class ResultsError(ValueError):
    """Results that cannot be read: ``problems`` has one line per problem and ``kinds`` the
    class of each (``missing``: no such folder or no summary; ``partial``: an unfinished run;
    ``invalid``: not the schema), so the gate can report each the way CI expects."""

    def __init__(self, problems: Sequence[str] | str,
                 kinds: Sequence[str] | str = "invalid") -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.kinds = ([kinds] * len(self.problems) if isinstance(kinds, str) else list(kinds))
        super().__init__("\n".join(self.problems))


@dataclass(frozen=True)
class Issue:
    """A content problem found while loading: ``kind`` is one of missing, nan, partial,
    mismatched; ``where`` names the file and record."""

    kind: str
    where: str
    message: str
    config: str | None = None  # canonical config string the issue concerns, if one
    task: str | None = None

    def __str__(self) -> str:
        return f"{self.kind}: {self.where}: {self.message}"


def config_key(text: str) -> str:
    """Canonical config string of a preset name or config string (labels that do not parse,
    e.g. a benchmark's peer kernel, are returned unchanged), so results match by meaning."""
    try:
        return str(parse_config(text))
    except ValueError:
        return text.strip()


def _num(value: Any) -> float:
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(type(value).__name__)
    return float(value)


# ---------------------------------------------------------------------------------------- drift
@dataclass(frozen=True)
class BucketSpec:
    """A position bucket ``[lo, hi)`` of token indices."""

    bucket: str
    lo: int
    hi: int


@dataclass(frozen=True)
class DriftStats:
    """Drift statistics of one config over one bucket (or over all positions: ``bucket`` is
    ``all``). ``values`` holds every numeric key of the STATS block (NaN for null)."""

    bucket: str
    lo: int | None
    hi: int | None
    values: Mapping[str, float]

    def get(self, metric: str) -> float | None:
        """The metric's value, or None when the block lacks the key."""
        return self.values.get(metric)

    @property
    def n(self) -> float:
        return self.values["n"]

    @property
    def kl_mean(self) -> float:
        return self.values["kl_mean"]

    @property
    def same_top1(self) -> float:
        return self.values["same_top1"]


@dataclass(frozen=True)
class DriftConfig:
    """One config's drift: overall statistics and one block per bucket."""

    name: str
    config: str
    overall: DriftStats | None
    buckets: tuple[DriftStats, ...]

    def stats(self, bucket: str) -> DriftStats | None:
        """Statistics of a bucket label, or ``all`` for the overall block."""
        if bucket in ("all", "overall"):
            return self.overall
        for b in self.buckets:
            if b.bucket == bucket:
                return b
        return None


@dataclass(frozen=True)
class DriftResults:
    """A validated drift ``summary.json``."""

    path: Path
    model: str
    model_type: str | None
    shape: ModelShape | None
    data: str | None
    seed: int | None
    prefill: int | None
    max_tokens: int | None
    tokens: int | None
    positions_per_config: int | None
    reference: str | None
    buckets: tuple[BucketSpec, ...]
    configs: tuple[DriftConfig, ...]
    decay_spectrum: dict | None
    plot: Path | None
    issues: tuple[Issue, ...] = ()
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    def config(self, key: str) -> DriftConfig | None:
        """The config with this label or (canonical) config string."""
        ck = config_key(key)
        for c in self.configs:
            if c.name == key or c.config == ck:
                return c
        return None

    def resolve_bucket(self, selector: str) -> str | None:
        """Bucket label of ``selector``: ``last`` (the longest positions), ``first``, ``all``
        (every position) or a label such as ``[1024,2047)``; None when there is no such bucket."""
        s = selector.strip()
        if s in ("all", "overall"):
            return "all"
        labels = [b.bucket for b in self.buckets]
        if s == "last":
            return labels[-1] if labels else None
        if s == "first":
            return labels[0] if labels else None
        return s if s in labels else None

    def config_issues(self, config: str) -> list[Issue]:
        """Issues that concern one config (by label or config string)."""
        c = self.config(config)
        return [] if c is None else [i for i in self.issues if i.config == c.config]


def _shape_from(meta: Any, model: str, where: str, problems: list[str]) -> ModelShape | None:
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


def _read_json(path: Path) -> dict:
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


def _opt_int(obj: dict, key: str, where: str, problems: list[str]) -> int | None:
    v = obj.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        problems.append(f"{where}: {key!r} must be an integer, got {v!r}")
        return None
    return v


def _stats(block: Any, where: str, problems: list[str], issues: list[Issue],
           bucket: str, lo: int | None, hi: int | None, config: str) -> DriftStats | None:
    if not isinstance(block, dict):
        problems.append(f"{where}: must be an object")
        return None
    missing = [k for k in DRIFT_REQUIRED_STATS if k not in block]
    if missing:
        problems.append(f"{where}: lacks {', '.join(repr(k) for k in missing)}")
        return None
    values: dict[str, float] = {}
    for k, v in block.items():
        if k in ("bucket", "lo", "hi"):
            continue
        try:
            values[k] = _num(v)
        except TypeError as e:
            problems.append(f"{where}: {k!r} must be a number or null, got {e}")
    nan = [k for k in _DRIFT_CORE if k in values and not math.isfinite(values[k])]
    if nan and values.get("n", 0) > 0:
        issues.append(Issue("nan", where, f"{', '.join(nan)} is NaN or infinite", config))
    return DriftStats(bucket, lo, hi, values)


def load_drift(path: str | Path, raw: dict | None = None) -> DriftResults:
    """Validate a drift folder (or its ``summary.json``); raises :class:`ResultsError`."""
    p = Path(path)
    file = p / "summary.json" if p.is_dir() else p
    obj = raw if raw is not None else _read_json(file)
    where = str(file)
    problems: list[str] = []
    issues: list[Issue] = []
    model = obj.get("model")
    if not isinstance(model, str) or not model:
        problems.append(f"{where}: 'model' must be a non-empty string")
        model = "?"
    specs: list[BucketSpec] = []
    buckets = obj.get("buckets")
    if not isinstance(buckets, list):
        problems.append(f"{where}: 'buckets' must be a list of {{bucket, lo, hi}}")
        buckets = []
    for i, b in enumerate(buckets):
        try:
            specs.append(BucketSpec(str(b["bucket"]), int(b["lo"]), int(b["hi"])))
        except (KeyError, TypeError, ValueError):
            problems.append(f"{where}: buckets[{i}] must be {{bucket, lo, hi}}, got {b!r}")
    if [s.lo for s in specs] != sorted(s.lo for s in specs):
        problems.append(f"{where}: buckets are not in ascending order")
    configs_raw = obj.get("configs")
    if not isinstance(configs_raw, list) or not configs_raw:
        problems.append(f"{where}: 'configs' must be a non-empty list")
        configs_raw = []
    positions = _opt_int(obj, "positions_per_config", where, problems)
    configs: list[DriftConfig] = []
    seen: dict[str, str] = {}
    labels = [s.bucket for s in specs]
    for i, c in enumerate(configs_raw):
        cw = f"{where}: configs[{i}]"
        if not isinstance(c, dict):
            problems.append(f"{cw}: must be an object")
            continue
        name, text = c.get("name"), c.get("config")
        if not isinstance(text, str):
            problems.append(f"{cw}: 'config' must be a config string")
            continue
        try:
            canon = str(parse_config(text))
        except ValueError as e:
            problems.append(f"{cw}: config {text!r} does not parse: {e}")
            continue
        name = name if isinstance(name, str) and name else canon
        cw = f"{where}: config {name!r}"
        if canon in seen:
            problems.append(f"{cw}: config {canon} appears twice (also as {seen[canon]!r})")
            continue
        seen[canon] = name
        overall_raw = c.get("overall")
        overall = None
        if not overall_raw:
            issues.append(Issue("partial", cw, "no overall statistics (no positions scored)",
                                canon))
        else:
            overall = _stats(overall_raw, f"{cw} overall", problems, issues, "all", None, None,
                             canon)
        blocks: list[DriftStats] = []
        braw = c.get("buckets")
        if not isinstance(braw, list):
            problems.append(f"{cw}: 'buckets' must be a list")
            braw = []
        for j, b in enumerate(braw):
            if not isinstance(b, dict) or not isinstance(b.get("bucket"), str):
                problems.append(f"{cw}: buckets[{j}] must be an object with a 'bucket' label")
                continue
            lo, hi = b.get("lo"), b.get("hi")
            s = _stats(b, f"{cw} bucket {b['bucket']}", problems, issues, b["bucket"],
                       lo if isinstance(lo, int) else None, hi if isinstance(hi, int) else None,
                       canon)
            if s is not None:
                blocks.append(s)
        have = {b.bucket for b in blocks}
        absent = [lab for lab in labels if lab not in have]
        if absent:
            issues.append(Issue("partial", cw, f"no statistics for bucket(s) {', '.join(absent)}",
                                canon))
        extra = sorted(have - set(labels))
        if extra:
            problems.append(f"{cw}: bucket(s) {', '.join(extra)} are not in the summary's "
                            "'buckets'")
        if overall is not None and positions is not None:
            n = overall.values.get("n", math.nan)
            if math.isfinite(n) and int(n) != positions:
                issues.append(Issue("partial", cw, f"{int(n)} positions scored, the run has "
                                                   f"{positions} per config", canon))
        configs.append(DriftConfig(name, canon, overall, tuple(blocks)))
    shape = _shape_from(obj.get("ssm_shape"), model, where, problems)
    spectrum = obj.get("decay_spectrum")
    if spectrum is not None and not (isinstance(spectrum, dict) and
                                     isinstance(spectrum.get("layers"), list)):
        problems.append(f"{where}: 'decay_spectrum' must be an object with a 'layers' list")
        spectrum = None
    ints = {k: _opt_int(obj, k, where, problems)
            for k in ("seed", "prefill", "max_tokens", "tokens")}
    if problems:
        raise ResultsError(problems)
    plot = file.parent / "kl_vs_position.png"
    return DriftResults(
        path=file.parent, model=model, model_type=obj.get("model_type"), shape=shape,
        data=obj.get("data"), seed=ints["seed"], prefill=ints["prefill"],
        max_tokens=ints["max_tokens"], tokens=ints["tokens"], positions_per_config=positions,
        reference=obj.get("reference"), buckets=tuple(specs), configs=tuple(configs),
        decay_spectrum=spectrum, plot=plot if plot.is_file() else None, issues=tuple(issues),
        raw=obj,
    )


# ---------------------------------------------------------------------------------------- tasks
@dataclass(frozen=True)
class TaskRow:
    """One (task, config) result of one model; fractions, NaN for null."""

    task: str
    name: str
    config: str
    n: int
    accuracy: float
    accuracy_lo: float
    accuracy_hi: float
    delta: float
    delta_lo: float
    delta_hi: float
    mcnemar_p: float
    flip_rate: float
    truncation_rate: float
    invalid_rate: float
    values: Mapping[str, float] = field(default_factory=dict, repr=False)

    @property
    def drop_hi_points(self) -> float:
        """Upper 95% bound of the accuracy drop against the reference, in points."""
        return -100.0 * self.delta_lo

    def get(self, metric: str) -> float | None:
        return self.values.get(metric)


@dataclass(frozen=True)
class TaskResults:
    """A validated task ``summary.json`` for one model."""

    path: Path
    model: str
    reference: str
    shape: ModelShape | None
    seed: int | None
    items: Mapping[str, int]
    rows: tuple[TaskRow, ...]
    issues: tuple[Issue, ...] = ()
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def tasks(self) -> list[str]:
        return list(dict.fromkeys(r.task for r in self.rows))

    @property
    def configs(self) -> list[str]:
        return list(dict.fromkeys(r.config for r in self.rows))

    def row(self, task: str, config: str) -> TaskRow | None:
        ck = config_key(config)
        for r in self.rows:
            if r.task == task and (r.config == ck or r.name == config):
                return r
        return None

    def is_reference(self, config: str) -> bool:
        return config_key(config) == self.reference

    def row_issues(self, task: str, config: str) -> list[Issue]:
        """Issues of one (task, config) result, and those of the whole task."""
        ck = config_key(config)
        return [i for i in self.issues
                if i.task == task and (i.config is None or i.config == ck)]


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
        ref_key = str(parse_config(ref))
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
    seen: set[tuple[str, str, str]] = set()
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
            canon = str(parse_config(r["config"]))
        except (ValueError, TypeError) as e:
            problems.append(f"{rw}: config {r['config']!r} does not parse: {e}")
            continue
        name = r.get("name") if isinstance(r.get("name"), str) and r.get("name") else canon
        rw = f"{where}: model {model!r} task {task!r} config {name!r}"
        if (model, task, canon) in seen:
            problems.append(f"{rw}: appears twice")
            continue
        seen.add((model, task, canon))
        values: dict[str, float] = {}
        bad = False
        for k, v in r.items():
            if k in ("model", "task", "name", "config"):
                continue
            try:
                values[k] = _num(v)
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
                      **{k: values[k] for k in TASK_REQUIRED_FIELDS[3:]}, values=values)
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
    shape = _shape_from(obj.get("ssm_shape"), top_model or "?", where, problems)
    seed = _opt_int(obj, "seed", where, problems)
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
    return _task_rows(raw if raw is not None else _read_json(file), file)


# ---------------------------------------------------------------------------------------- folders
def _kind(obj: dict) -> str | None:
    kind = obj.get("kind")
    if kind in ("drift", "tasks"):
        return kind
    if "results" in obj:
        return "tasks"
    if "configs" in obj and "buckets" in obj:
        return "drift"
    return None


@dataclass
class ModelResults:
    """Everything known about one model: at most one drift result and one task result."""

    model: str
    drift: DriftResults | None = None
    tasks: TaskResults | None = None
    cross_issues: list[Issue] = field(default_factory=list)

    @property
    def shape(self) -> ModelShape | None:
        if self.drift is not None and self.drift.shape is not None:
            return self.drift.shape
        return self.tasks.shape if self.tasks is not None else None

    @property
    def issues(self) -> list[Issue]:
        out: list[Issue] = list(self.cross_issues)
        for r in (self.drift, self.tasks):
            if r is not None:
                out += list(r.issues)
        return out

    def configs(self) -> list[str]:
        """Canonical config strings with any evidence, drift order first."""
        keys: list[str] = []
        if self.drift is not None:
            keys += [c.config for c in self.drift.configs]
        if self.tasks is not None:
            keys += self.tasks.configs
        return list(dict.fromkeys(keys))

    def label(self, config: str) -> str:
        """The name results use for a config (preset name when it has one)."""
        ck = config_key(config)
        if self.drift is not None and (c := self.drift.config(ck)) is not None:
            return c.name
        if self.tasks is not None:
            for r in self.tasks.rows:
                if r.config == ck:
                    return r.name
        return config


@dataclass
class ResultSet:
    """All results found under some paths, by model."""

    models: dict[str, ModelResults] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)

    def model(self, name: str | None = None) -> ModelResults:
        """One model's results: ``name``, or the only model; :class:`ResultsError` otherwise."""
        if name is not None:
            if name not in self.models:
                raise ResultsError(f"no results for model {name!r}; results are for "
                                   f"{', '.join(map(repr, self.models)) or 'no model'}",
                                   "missing")
            return self.models[name]
        if len(self.models) != 1:
            raise ResultsError(f"results hold {len(self.models)} models "
                               f"({', '.join(map(repr, self.models))}); choose one with --model")
        return next(iter(self.models.values()))


_SKIP_DIRS = {"pairs", "reference", ".git", "__pycache__"}


def _summaries(root: Path, depth: int = 3) -> list[Path]:
    if (root / "summary.json").is_file():
        return [root / "summary.json"]
    if depth == 0:
        return []
    found: list[Path] = []
    for sub in sorted(p for p in root.iterdir() if p.is_dir() and p.name not in _SKIP_DIRS):
        found += _summaries(sub, depth - 1)
    return found


def load_results(paths: Iterable[str | Path]) -> ResultSet:
    """Find and validate every ``summary.json`` under ``paths`` (folders, or summary files)
    and group them by model. Raises :class:`ResultsError` listing every problem found."""
    problems: list[str] = []
    kinds: list[str] = []
    out = ResultSet()
    for raw_path in paths:
        p = Path(raw_path).expanduser()
        if not p.exists():
            problems.append(f"{p}: no such file or folder")
            kinds.append("missing")
            continue
        if p.is_file():
            files = [p]
        else:
            files = _summaries(p)
            if not files:
                interrupted = (p / "pairs").is_dir()
                hint = (" (it holds pairs/ but no summary.json: an interrupted drift run; rerun "
                        "drift with the same --out to finish it)") if interrupted else ""
                problems.append(f"{p}: no summary.json found{hint}")
                kinds.append("partial" if interrupted else "missing")
                continue
        for f in files:
            try:
                obj = _read_json(f)
                kind = _kind(obj)
                if kind is None:
                    raise ResultsError(f"{f}: neither a drift summary ('configs' and 'buckets') "
                                       "nor a task summary ('results')")
                if kind == "drift":
                    d = load_drift(f, obj)
                    m = out.models.setdefault(d.model, ModelResults(d.model))
                    if m.drift is not None:
                        raise ResultsError(f"{f}: a second drift result for model {d.model!r} "
                                           f"(the first is {m.drift.path}); pass one per model")
                    m.drift = d
                else:
                    for model, t in load_tasks(f, obj).items():
                        m = out.models.setdefault(model, ModelResults(model))
                        if m.tasks is not None:
                            m.tasks = _merge_tasks(m.tasks, t)
                        else:
                            m.tasks = t
                out.files.append(f)
            except ResultsError as e:
                problems += e.problems
                kinds += e.kinds
    if problems:
        raise ResultsError(problems, kinds)
    if not out.models:
        raise ResultsError("no results given", "missing")
    for m in out.models.values():
        m.cross_issues = _cross_check(m)
    return out


def _cross_check(m: ModelResults) -> list[Issue]:
    """Drift and task results of one model must use the same name for the same config."""
    if m.drift is None or m.tasks is None:
        return []
    issues = []
    drift_names = {c.name: c.config for c in m.drift.configs}
    for r in m.tasks.rows:
        if r.name in drift_names and drift_names[r.name] != r.config:
            issues.append(Issue(
                "mismatched", f"model {m.model!r} config {r.name!r}",
                f"drift ({m.drift.path}) means {drift_names[r.name]}, task results "
                f"({m.tasks.path}) mean {r.config}", r.config))
    return list({str(i): i for i in issues}.values())


def _merge_tasks(a: TaskResults, b: TaskResults) -> TaskResults:
    """Task results of one model from two runs (e.g. one per task): no (task, config) twice,
    one reference."""
    if a.reference != b.reference:
        raise ResultsError(f"{b.path}: task results for model {a.model!r} pair against "
                           f"{b.reference}, those in {a.path} against {a.reference}",
                           "mismatched")
    keys = {(r.task, r.config) for r in a.rows}
    dup = [f"{r.task}/{r.name}" for r in b.rows if (r.task, r.config) in keys]
    if dup:
        raise ResultsError(f"{b.path}: results for model {a.model!r} repeat {', '.join(dup)} "
                           f"from {a.path}")
    return TaskResults(path=a.path, model=a.model, reference=a.reference,
                       shape=a.shape or b.shape, seed=a.seed if a.seed is not None else b.seed,
                       items={**a.items, **b.items}, rows=a.rows + b.rows,
                       issues=a.issues + b.issues, raw=a.raw)
