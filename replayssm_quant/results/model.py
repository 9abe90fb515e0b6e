"""The results data model: typed records of drift (``replayssm-quant drift``) and task
evaluation (``replayssm-quant eval``) folders, as the loaders in this package validate them.

The recommender, the reports and the CI gate all read results through these records, so the
writers and the readers agree on one schema and a malformed folder fails with one message per
problem instead of a ``KeyError`` deep inside a report. Config strings are parsed once, by the
loader, into :class:`~replayssm_quant.precision.PrecisionConfig` objects.

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
     "documents": [...], "device": str, "dtype": str, "versions": {...},
     "files": {"drift.parquet": {"rows", "bytes", "sha256"}, "drift_pooled.parquet": {...}}}

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
                  "delta": f, "delta_lo": f, "delta_hi": f,     # paired difference vs reference
                  "delta_ci_method": str,   # how delta_lo/delta_hi were computed, e.g.
                                            # "tango-score"; rows without it are undecided
                  "mcnemar_p": f, "flip_rate": f, "truncation_rate": f,
                  "invalid_rate": f}, ...],
     "files": {"items.parquet": {"rows": int, "bytes": int, "sha256": str}, ...}}

Both kinds record, under ``"files"``, every data file the writer put next to the summary
(path relative to the folder: row count, size, sha256); the loaders verify them
(:mod:`.verify`). Folders written before the record existed load with one warning.

Other keys are allowed (the writers add provenance); extra fields of a STATS block or a task
row must be numbers or null (``delta_ci_method`` is a string). A summary may say what it is
with ``"kind": "drift"`` or
``"kind": "tasks"``; without it the kind is read from the keys.

Problems with the content rather than the form (a NaN metric, a config with fewer positions
or items than the run should have, a config missing from a bucket) do not raise: they are kept
as :class:`Issue` records on the result, so the gate can fail closed on them and the
recommender can reject the affected configs with a reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..precision import ModelShape, PrecisionConfig, parse_config
from .errors import ResultsError

__all__ = [
    "DRIFT_REQUIRED_STATS",
    "ISSUE_KINDS",
    "TASK_REQUIRED_FIELDS",
    "BucketSpec",
    "ConfigKey",
    "DriftConfig",
    "DriftResults",
    "DriftStats",
    "Issue",
    "ModelResults",
    "ResultSet",
    "TaskResults",
    "TaskRow",
    "config_key",
]

DRIFT_REQUIRED_STATS: tuple[str, ...] = (
    "n", "kl_mean", "kl_ci_lo", "kl_ci_hi", "kl_median", "kl_p90", "kl_p99", "kl_max",
    "same_top1", "ppl_ratio",
)
"""Keys every drift STATS block must have (values may be ``null``)."""

TASK_REQUIRED_FIELDS: tuple[str, ...] = (
    "task", "config", "n", "accuracy", "accuracy_lo", "accuracy_hi", "delta", "delta_lo",
    "delta_hi", "mcnemar_p", "flip_rate", "truncation_rate", "invalid_rate",
)
"""Keys every task result row must have (values other than ``task``/``config`` may be null)."""

ISSUE_KINDS = ("missing", "nan", "partial", "mismatched")


@dataclass(frozen=True)
class Issue:
    """A content problem found while loading: ``kind`` is one of missing, nan, partial,
    mismatched; ``where`` names the file and record."""

    kind: str
    where: str
    message: str
    config: PrecisionConfig | None = None  # the config the issue concerns, if one
    task: str | None = None

    def __str__(self) -> str:
        return f"{self.kind}: {self.where}: {self.message}"


ConfigKey = PrecisionConfig | str
"""What results match configs by: the parsed config, or the label of something that is not one
(e.g. a benchmark's peer kernel)."""


def config_key(text: str | PrecisionConfig) -> ConfigKey:
    """The parsed config of a preset name or config string (labels that do not parse are
    returned stripped), so results match by meaning, not by spelling."""
    try:
        return parse_config(text)
    except ValueError:
        return text.strip()


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
    config: PrecisionConfig
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

    def config(self, key: str | PrecisionConfig) -> DriftConfig | None:
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

    def config_issues(self, config: str | PrecisionConfig) -> list[Issue]:
        """Issues that concern one config (by label or config string)."""
        c = self.config(config)
        return [] if c is None else [i for i in self.issues if i.config == c.config]


# ---------------------------------------------------------------------------------------- tasks
@dataclass(frozen=True)
class TaskRow:
    """One (task, config) result of one model; fractions, NaN for null."""

    task: str
    name: str
    config: PrecisionConfig
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
    delta_ci_method: str | None = None

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
    reference: PrecisionConfig
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
    def configs(self) -> list[PrecisionConfig]:
        return list(dict.fromkeys(r.config for r in self.rows))

    def row(self, task: str, config: str | PrecisionConfig) -> TaskRow | None:
        ck = config_key(config)
        for r in self.rows:
            if r.task == task and (r.config == ck or r.name == config):
                return r
        return None

    def is_reference(self, config: str | PrecisionConfig) -> bool:
        return config_key(config) == self.reference

    def row_issues(self, task: str, config: str | PrecisionConfig) -> list[Issue]:
        """Issues of one (task, config) result, and those of the whole task."""
        ck = config_key(config)
        return [i for i in self.issues
                if i.task == task and (i.config is None or i.config == ck)]


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

    def configs(self) -> list[PrecisionConfig]:
        """Configs with any evidence, drift order first."""
        keys: list[PrecisionConfig] = []
        if self.drift is not None:
            keys += [c.config for c in self.drift.configs]
        if self.tasks is not None:
            keys += self.tasks.configs
        return list(dict.fromkeys(keys))

    def label(self, config: str | PrecisionConfig) -> str:
        """The name results use for a config (preset name when it has one)."""
        ck = config_key(config)
        if self.drift is not None and (c := self.drift.config(ck)) is not None:
            return c.name
        if self.tasks is not None:
            for r in self.tasks.rows:
                if r.config == ck:
                    return r.name
        return str(config)


@dataclass
class ResultSet:
    """All results found under some paths, by model."""

    models: dict[str, ModelResults] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    """At most one line: folders whose data files could not be verified."""

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
