"""The recommender's budget: its YAML schema (``--budget`` files and the command's flags) and
its compilation into the check language (:class:`~.criteria.Criteria`).

A budget file is a mapping of the keys of :class:`Budget` (optionally under a top-level
``budget:``); unknown keys are errors, so a typo cannot silently leave a limit at its default.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .criteria import Check, Criteria
from .errors import InputError, read_yaml
from .evidence import Evidence

__all__ = ["DEFAULT_BUDGET", "DROP_LABEL", "Budget"]

DROP_LABEL = "accuracy drop (upper 95% bound, points)"
"""How recommendations name the task check (``drop_hi_points``)."""


@dataclass(frozen=True)
class Budget:
    """The accuracy a config must keep to be recommended. ``None`` switches a limit off.

    max_kl: upper limit of the drift statistic ``kl_stat`` (nats) in ``bucket``.
    kl_stat: which drift statistic: ``kl_mean`` (default), ``kl_ci_hi`` (upper 95% bound),
        ``kl_median``, ``kl_p90``, ``kl_p99``, ``kl_max``.
    bucket: the position bucket the drift limits apply to: ``last`` (the longest positions,
        where a drifting state has had the most time to go wrong), ``all``, or a label such as
        ``[1024,2047)``.
    min_same_top1: lower limit of the top-1 agreement with the reference in ``bucket``.
    max_ppl_ratio: upper limit of the perplexity ratio in ``bucket`` (off by default).
    max_accuracy_drop: upper limit, in accuracy points, of the upper 95% bound of the paired
        accuracy drop against the reference, for every task.
    task_max_accuracy_drop: per-task overrides of ``max_accuracy_drop``.
    require_drift / require_tasks: reject every config when that evidence is absent (task
        evaluations need a GPU and hours, so by default a drift-only recommendation is made
        and says that tasks were not checked).
    max_truncation_rate / max_invalid_rate: the largest share (a fraction) of truncated /
        invalid answers, in a config's and the reference's task rows, for a task check to be
        decided; beyond it the check is undecided, never a pass (:mod:`.evidence`).
    """

    max_kl: float | None = 0.01
    kl_stat: str = "kl_mean"
    bucket: str = "last"
    min_same_top1: float | None = 0.99
    max_ppl_ratio: float | None = None
    max_accuracy_drop: float | None = 1.0
    task_max_accuracy_drop: Mapping[str, float | None] = field(default_factory=dict)
    require_drift: bool = True
    require_tasks: bool = False
    max_truncation_rate: float | None = 0.10
    max_invalid_rate: float | None = 0.10

    def __post_init__(self) -> None:
        for name in ("max_kl", "min_same_top1", "max_ppl_ratio", "max_accuracy_drop",
                     "max_truncation_rate", "max_invalid_rate"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                  or not math.isfinite(v)):
                raise InputError(f"budget {name} must be a finite number or null, got {v!r}")
        for name in ("max_truncation_rate", "max_invalid_rate"):
            v = getattr(self, name)
            if v is not None and not 0 <= v <= 1:
                raise InputError(f"budget {name} is a fraction in [0, 1] (0.1 = 10%), got {v}")
        if self.max_kl is not None and self.max_kl < 0:
            raise InputError(f"budget max_kl must be >= 0, got {self.max_kl}")
        if self.min_same_top1 is not None and not 0 <= self.min_same_top1 <= 1:
            raise InputError("budget min_same_top1 is a fraction in [0, 1] (0.99 = 99%), got "
                             f"{self.min_same_top1}")
        if not isinstance(self.kl_stat, str) or not self.kl_stat.startswith("kl_"):
            raise InputError(f"budget kl_stat must name a KL statistic (kl_mean, kl_ci_hi, "
                             f"kl_median, kl_p90, kl_p99, kl_max), got {self.kl_stat!r}")
        if not isinstance(self.bucket, str) or not self.bucket.strip():
            raise InputError("budget bucket must be 'last', 'all' or a bucket label")
        if not isinstance(self.task_max_accuracy_drop, Mapping):
            raise InputError("budget task_max_accuracy_drop must map task names to points")
        for task, v in self.task_max_accuracy_drop.items():
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise InputError(f"budget task_max_accuracy_drop[{task!r}] must be a number "
                                 f"or null, got {v!r}")
        for name in ("require_drift", "require_tasks"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"budget {name} must be true or false")

    def drop_limit(self, task: str) -> float | None:
        return self.task_max_accuracy_drop.get(task, self.max_accuracy_drop)

    def criteria(self, tasks: Sequence[str] = ()) -> Criteria:
        """The budget in the check language, for results with these ``tasks``: one drift check
        per drift limit (in ``bucket``) and one accuracy-drop check per task with a limit."""
        checks: list[Check] = []
        if self.max_kl is not None:
            checks.append(Check(self.kl_stat, "drift", self.kl_stat, ("*",), self.bucket,
                                max=self.max_kl, miss="ratio"))
        if self.min_same_top1 is not None:
            checks.append(Check("same_top1", "drift", "same_top1", ("*",), self.bucket,
                                min=self.min_same_top1, miss="rate"))
        if self.max_ppl_ratio is not None:
            checks.append(Check("ppl_ratio", "drift", "ppl_ratio", ("*",), self.bucket,
                                max=self.max_ppl_ratio, miss="ppl"))
        for task in tasks:
            limit = self.drop_limit(task)
            if limit is not None:
                checks.append(Check(f"accuracy-drop-{task}", "tasks", "drop_hi_points", ("*",),
                                    tasks=(task,), max=limit, label=DROP_LABEL,
                                    miss="points"))
        return Criteria(tuple(checks), require_drift=self.require_drift,
                        require_tasks=("*",) if self.require_tasks else (),
                        evidence=Evidence(self.max_truncation_rate, self.max_invalid_rate))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["task_max_accuracy_drop"] = dict(self.task_max_accuracy_drop)
        return d

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], base: Budget | None = None) -> Budget:
        """A budget from a mapping (the YAML file), on top of ``base`` (default: the defaults).
        Unknown keys are errors, so a typo cannot silently leave a limit at its default."""
        if "budget" in data and len(data) == 1 and isinstance(data["budget"], Mapping):
            data = data["budget"]
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InputError(f"unknown budget key(s) {', '.join(map(repr, unknown))}; keys: "
                             f"{', '.join(sorted(known))}")
        return replace(base or cls(), **dict(data))

    @classmethod
    def from_yaml(cls, path: str | Path, base: Budget | None = None) -> Budget:
        p = Path(path)
        data = read_yaml(p, "budget", InputError, lambda message: message.splitlines()[0])
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise InputError(f"{p}: a budget file is a mapping of budget keys")
        try:
            return cls.from_mapping(data, base)
        except InputError as e:
            raise InputError(f"{p}: {e}") from None


DEFAULT_BUDGET = Budget()
