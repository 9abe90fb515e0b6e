"""The suite's generated tasks (RULER, ``carry_chain``): their wrapper tasks, run settings and
result shaping, kept apart from the suite runner.

Their items are built here rather than read from the hub or ``--data``, so ``--limit`` sets how
many are built (per subtask and context length for RULER) and lm-eval runs them all; RULER keeps
its own ``max_gen_toks`` (its items are sized to leave exactly that room in the context).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .carry_chain import CarryChainDifficulty, write_carry_chain_task
from .ruler import (
    DEFAULT_CONTEXT_LENGTHS,
    import_stock_modules,
    num_samples_for,
    plan,
    rescore_items,
    resolve_subtasks,
    split_by_length,
    tokenizer_source,
    write_ruler_tasks,
)
from .tasks import TaskSpec

__all__ = [
    "CARRY_CHAIN_ITEMS",
    "breakdown_items",
    "GeneratedSettings",
    "is_generated",
    "prepare_task",
    "shape_items",
    "shape_results",
]

CARRY_CHAIN_ITEMS = 100
"""carry_chain problems without ``--limit``."""


class GeneratedSettings:
    """What the generated tasks take from the suite's settings."""

    def __init__(self, *, model: str, limit: int | float | None, seed: int,
                 context_lengths: Sequence[int] = DEFAULT_CONTEXT_LENGTHS,
                 ruler_subtasks: Sequence[str] | None = None, carry_terms: int = 48,
                 carry_rule: str = "table") -> None:
        self.model = model
        self.limit = limit
        self.seed = seed
        self.context_lengths = tuple(int(n) for n in context_lengths)
        self.ruler_subtasks = resolve_subtasks(ruler_subtasks)
        self.carry_terms = int(carry_terms)
        self.carry_rule = str(carry_rule)

    def run_key(self, spec: TaskSpec) -> dict[str, Any]:
        """The settings that make two runs of a generated task the same run."""
        if spec.key == "ruler":
            return {"context_lengths": list(self.context_lengths),
                    "subtasks": {s: list(ls) for s, ls in
                                 plan(self.ruler_subtasks, self.context_lengths).items()}}
        if spec.key == "carry_chain":
            key: dict[str, Any] = {"carry_terms": self.carry_terms}
            if self.carry_rule != "table":  # the default stays out: older runs keep their key
                key["carry_rule"] = self.carry_rule
            return key
        return {}


def is_generated(spec: TaskSpec) -> bool:
    return spec.source == "generated"


def _carry_items(limit: int | float | None) -> int:
    if limit is None:
        return CARRY_CHAIN_ITEMS
    return int(limit) if limit >= 1 else max(1, math.ceil(limit * CARRY_CHAIN_ITEMS))


def prepare_task(spec: TaskSpec, settings: GeneratedSettings, out_dir: str | Path) -> str:
    """Write the wrapper task(s) of ``spec`` under ``out_dir``; returns the lm-eval name."""
    out_dir = Path(out_dir)
    if spec.key == "ruler":
        import_stock_modules(settings.ruler_subtasks)
        name, _ = write_ruler_tasks(out_dir / "ruler", settings.ruler_subtasks,
                                    settings.context_lengths, tokenizer_source(settings.model),
                                    num_samples_for(settings.limit), settings.seed)
        return name
    if spec.key == "carry_chain":
        difficulty = CarryChainDifficulty(terms=settings.carry_terms, rule=settings.carry_rule)
        return write_carry_chain_task(out_dir / "carry_chain", _carry_items(settings.limit),
                                      settings.seed, difficulty)
    raise ValueError(f"{spec.key} is not a generated task")


def shape_results(spec: TaskSpec, results: dict[str, Any]) -> dict[str, Any]:
    """lm-eval's results as the paired statistics read them (RULER: one subtask per length)."""
    return split_by_length(results) if spec.key == "ruler" else results


def shape_items(spec: TaskSpec, items: Any) -> Any:
    """The per-item table with the task's own notion of a right answer (RULER: every expected
    string within the fixed answer window)."""
    return rescore_items(items) if spec.key == "ruler" else items


BREAKDOWN = ("ruler",)
"""Tasks whose results are also given per subtask (RULER: per subtask and context length)."""


def breakdown_items(items: Any) -> Any:
    """``items`` plus, for RULER, a copy of its items under the task name
    ``ruler/<subtask>@<length>``, so the paired comparison gives one row per (subtask, length,
    config) beside the overall one."""
    import pandas as pd

    if not len(items) or "task" not in items.columns:
        return items
    parts = [items]
    for task in BREAKDOWN:
        mine = items[items["task"] == task]
        if len(mine):
            parts.append(mine.assign(task=task + "/" + mine["subtask"].astype(str)))
    return pd.concat(parts, ignore_index=True) if len(parts) > 1 else items
