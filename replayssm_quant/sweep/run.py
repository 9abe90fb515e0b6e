"""The sweep driver: units of a plan as Ray tasks, each started once the units it waits for are
done, with a resource request per unit and a bounded number of retries.

Ray schedules and retries; this module only orders the units (a document's reference before its
configs, a folder's units before its summary), caps how many run at once, and tells which units
failed and which never ran because they waited for a failed one. A unit that fails does not stop
the others. Killing the driver loses nothing: every unit writes its files atomically and finds
them on the next run, so the same command resumes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .plan import ModelEntry, Plan, Unit, expand
from .units import run_unit

__all__ = ["SweepProgress", "SweepResult", "UnitOutcome", "default_num_gpus", "run_sweep"]

SMALL_MODEL_BYTES = 2 << 30
"""Weights under this size share a GPU four ways by default (``num_gpus: 0.25``)."""


@dataclass
class UnitOutcome:
    """How one unit ended: ``ok`` and ``ran`` (computed now, rather than found done), or the
    ``error`` it raised on its last attempt; ``skipped`` names a failed unit it waited for."""

    id: str
    ok: bool
    ran: bool = False
    seconds: float = 0.0
    error: str | None = None
    skipped: str | None = None


@dataclass
class SweepResult:
    """Every unit's outcome, in plan order, and the Ray dashboard address (empty: none)."""

    outcomes: list[UnitOutcome] = field(default_factory=list)
    dashboard_url: str = ""

    @property
    def failed(self) -> list[UnitOutcome]:
        return [o for o in self.outcomes if not o.ok and o.skipped is None]

    @property
    def skipped(self) -> list[UnitOutcome]:
        return [o for o in self.outcomes if o.skipped is not None]

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outcomes)


class SweepProgress(Protocol):
    """What :func:`run_sweep` reports (the CLI draws a bar and logs a line per unit)."""

    def started(self, total: int, dashboard_url: str) -> None: ...

    def finished(self, outcome: UnitOutcome, done: int, total: int) -> None: ...


def default_num_gpus(model: str, cluster_gpus: float) -> float:
    """GPUs a unit of ``model`` asks for when the plan does not say: none on a cluster without
    GPUs; a quarter of one for weights under :data:`SMALL_MODEL_BYTES`; else one."""
    if cluster_gpus <= 0:
        return 0.0
    size = _weights_bytes(model)
    return 0.25 if size is not None and size < SMALL_MODEL_BYTES else 1.0


def _weights_bytes(model: str) -> int | None:
    from ..models.fixture import FIXTURES, fixture_path

    if model.startswith("random:"):
        return 0
    folder = fixture_path(model) if model in FIXTURES else Path(model).expanduser()
    if not folder.is_dir():
        return None  # a hub id: unknown without downloading
    return sum(p.stat().st_size for p in folder.iterdir()
               if p.suffix in (".safetensors", ".bin", ".pt"))


def _resources(entry: ModelEntry, plan: Plan, cluster_gpus: float) -> dict[str, float]:
    cpus = entry.num_cpus if entry.num_cpus is not None else plan.num_cpus
    gpus = entry.num_gpus if entry.num_gpus is not None else plan.num_gpus
    if gpus is None:
        gpus = default_num_gpus(entry.name, cluster_gpus)
    return {"num_cpus": cpus, "num_gpus": gpus}


def _remote_unit(unit: Unit, plan: Plan, responder: str | None) -> dict[str, Any]:
    """The Ray task: one unit in a worker process."""
    return run_unit(unit, plan, responder)


def _start_ray(address: str | None, workers: int | None) -> Any:
    import ray

    kw: dict[str, Any] = dict(log_to_driver=False, logging_level=logging.WARNING)
    if address:
        return ray.init(address=address, **kw)
    return ray.init(num_cpus=os.cpu_count() or 1, object_store_memory=200 << 20, **kw)


def run_sweep(plan: Plan, *, address: str | None = None, workers: int | None = None,
              retries: int = 1, responder: str | None = None,
              progress: SweepProgress | None = None,
              units: Sequence[Unit] | None = None) -> SweepResult:
    """Run every unit of ``plan`` on Ray (a local instance unless ``address`` names a cluster);
    at most ``workers`` at once; each retried up to ``retries`` times. ``responder``:
    ``module:function`` of an answer factory for eval units (tests)."""
    import ray

    todo = list(units) if units is not None else expand(plan)
    ctx = _start_ray(address, workers)
    try:
        return _drive(ray, ctx, plan, todo, workers, retries, responder, progress)
    finally:
        ray.shutdown()


def _drive(ray: Any, ctx: Any, plan: Plan, todo: list[Unit], workers: int | None,
           retries: int, responder: str | None,
           progress: SweepProgress | None) -> SweepResult:
    result = SweepResult(dashboard_url=getattr(ctx, "dashboard_url", "") or "")
    cluster_gpus = float(ray.cluster_resources().get("GPU", 0))
    entries = {m.name: m for m in plan.models}
    task = ray.remote(_remote_unit)
    outcomes: dict[str, UnitOutcome] = {}
    pending = list(todo)
    in_flight: dict[Any, Unit] = {}
    cap = workers or len(todo) or 1
    if progress is not None:
        progress.started(len(todo), result.dashboard_url)

    def finish(o: UnitOutcome) -> None:
        outcomes[o.id] = o
        if progress is not None:
            progress.finished(o, len(outcomes), len(todo))

    while pending or in_flight:
        for unit in list(pending):
            bad = next((a for a in unit.after if a in outcomes and not outcomes[a].ok), None)
            if bad is not None:
                pending.remove(unit)
                finish(UnitOutcome(unit.id, ok=False, skipped=bad))
            elif len(in_flight) < cap and all(a in outcomes for a in unit.after):
                pending.remove(unit)
                opts = _resources(entries[unit.model], plan, cluster_gpus)
                ref = task.options(**opts, max_retries=retries, retry_exceptions=True,
                                   name=unit.id).remote(unit, plan, responder)
                in_flight[ref] = unit
        if not in_flight:
            break
        ready, _ = ray.wait(list(in_flight), num_returns=1)
        for ref in ready:
            unit = in_flight.pop(ref)
            try:
                r = ray.get(ref)
                finish(UnitOutcome(unit.id, ok=True, ran=bool(r["ran"]), seconds=r["seconds"]))
            except Exception as e:  # the unit's exception after its retries, or a lost worker
                finish(UnitOutcome(unit.id, ok=False, error=_error_text(e)))
    result.outcomes = [outcomes[u.id] for u in todo if u.id in outcomes]
    return result


def _error_text(exc: BaseException) -> str:
    """The unit's own exception in one line (Ray wraps it with a remote traceback)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        exc = cause
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text[:300]}"
