"""Find and validate every ``summary.json`` under some paths and group them by model: the one
entry point the recommender, the reports and the gate read results through. The data files a
summary records are verified against their sizes, checksums and row counts (:mod:`.verify`)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from .drift import load_drift
from .errors import ResultsError
from .model import Issue, ModelResults, ResultSet, TaskResults
from .reading import read_json
from .tasks import load_tasks
from .verify import verify_files

__all__ = ["load_results"]


def _kind(obj: dict) -> str | None:
    kind = obj.get("kind")
    if kind in ("drift", "tasks"):
        return kind
    if "results" in obj:
        return "tasks"
    if "configs" in obj and "buckets" in obj:
        return "drift"
    return None


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
    unrecorded: list[str] = []
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
                obj = read_json(f)
                kind = _kind(obj)
                if kind is None:
                    raise ResultsError(f"{f}: neither a drift summary ('configs' and 'buckets') "
                                       "nor a task summary ('results')")
                if not verify_files(f.parent, obj, kind):
                    unrecorded.append(str(f.parent))
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
    if unrecorded:
        out.warnings.append(
            f"{', '.join(unrecorded)}: summary.json records no sizes or checksums of its data "
            "files (written by an older version), so they are not verified")
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
