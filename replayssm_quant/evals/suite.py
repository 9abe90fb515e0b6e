"""Run the task suite for one model over several precision configs, resumably, and summarise.

Output folder (``out``, one model; the task ``summary.json`` schema of
:mod:`replayssm_quant.results`)::

    summary.json                       per (task, config): n, accuracy + CI, paired delta vs the
                                       reference + score CI (and its method), McNemar p, flip/
                                       truncation/invalid rates (what the recommender and the
                                       gate read); rows, size and sha256 of each parquet file
    items.parquet                      every item of every run (doc ids, prompt hashes, answers)
    tasks/                             wrapper task YAMLs (with ``--data``)
    runs/<task>/<config>/
        results.json                   lm-eval's results (samples stripped) + run settings
        samples/<subtask>.jsonl        lm-eval's per-sample logs
        generations.jsonl              the backend's generation log (finish reason, truncation,
                                       text, and a key over prompt + generation kwargs)
        items.parquet                  this run's per-item table
        run.json                       completion marker, written last

A (task, config) whose ``run.json`` holds the same settings is not run again; every file is
written to a temporary name and renamed, so an interrupted run leaves no half-written result.
A run redone with another ``limit`` (all other settings equal) answers the requests its previous
run already generated from that run's ``generations.jsonl`` and generates only the new ones.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..precision import PRESETS, PrecisionConfig, parse_config
from .generated import (
    GeneratedSettings,
    breakdown_items,
    is_generated,
    prepare_task,
    shape_items,
    shape_results,
)
from .paired import compare, items_from_results, summarize_items
from .records import file_records
from .ruler import DEFAULT_CONTEXT_LENGTHS
from .tasks import TASKS, TaskSpec, find_data_files, run_task, write_local_tasks

__all__ = [
    "REFERENCE",
    "SuiteProgress",
    "SuiteResult",
    "SuiteSettings",
    "load_items",
    "run_suite",
    "slug",
    "summarize",
    "write_summary",
]

REFERENCE = "fp32"
"""The reference config every other config is paired against (conventional FP32 decoding)."""

SUMMARY_VERSION = 1


def slug(text: str) -> str:
    """A file-name-safe form of a model name or config label."""
    s = re.sub(r"[^A-Za-z0-9.+-]+", "_", text.replace("/", "--").replace("=", "-"))
    return s.strip("_") or "x"


def _atomic_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _atomic_json(path: Path, obj: Any) -> None:
    _atomic_bytes(path, json.dumps(obj, indent=2, default=_json_default, allow_nan=True)
                  .encode())


def _atomic_jsonl(path: Path, rows: Sequence[Any]) -> None:
    text = "".join(json.dumps(r, default=_json_default, ensure_ascii=False) + "\n" for r in rows)
    _atomic_bytes(path, text.encode())


def _atomic_parquet(path: Path, frame: pd.DataFrame) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    frame.to_parquet(tmp, index=False)
    os.replace(tmp, path)


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, tuple)):
        return list(o)
    if isinstance(o, Path):
        return str(o)
    return str(o)


def finite_json(x: Any) -> Any:
    """NaN -> None so the JSON files an eval writes are strict JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, list):
        return [finite_json(v) for v in x]
    if isinstance(x, dict):
        return {k: finite_json(v) for k, v in x.items()}
    return x


@dataclass(frozen=True)
class SuiteSettings:
    """What makes two runs of one (model, task, config) the same run."""

    model: str
    tasks: tuple[str, ...]
    configs: tuple[str, ...]
    limit: int | float | None = None
    max_gen_toks: int = 32768
    seed: int = 0
    data: str | None = None
    backend: str = "hf"
    dtype: str = "float32"
    device: str = "cpu"
    batch_size: int = 8
    context_lengths: tuple[int, ...] = DEFAULT_CONTEXT_LENGTHS
    ruler_subtasks: tuple[str, ...] | None = None
    carry_terms: int = 48
    carry_rule: str = "table"
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    """vllm backend: GPUs per model copy (tensor parallel) and model copies (data parallel);
    they change where the work runs, not the results, so they are no part of a run's key."""

    def generated(self) -> GeneratedSettings:
        """The settings of the generated tasks (RULER, carry_chain)."""
        return GeneratedSettings(model=self.model, limit=self.limit, seed=self.seed,
                                 context_lengths=self.context_lengths,
                                 ruler_subtasks=self.ruler_subtasks, carry_terms=self.carry_terms,
                                 carry_rule=self.carry_rule)

    def run_key(self, task: str, cfg: PrecisionConfig, data_hash: str | None) -> dict[str, Any]:
        key = {"model": self.model, "task": task, "config": str(cfg), "limit": self.limit,
               "max_gen_toks": self.max_gen_toks, "seed": self.seed, "data": data_hash,
               "backend": self.backend, "dtype": self.dtype}
        if task in TASKS and is_generated(TASKS[task]):
            key |= self.generated().run_key(TASKS[task])
        return key


class SuiteProgress:
    """Callbacks for a front end; the defaults do nothing."""

    def run_started(self, task: str, config: str, index: int, total: int) -> None: ...

    def requests(self, done: int, total: int) -> None: ...

    def run_finished(self, task: str, config: str, summary: dict[str, Any], cached: bool,
                     seconds: float) -> None: ...


@dataclass
class SuiteResult:
    """What :func:`run_suite` did: the summary and items over every finished run in ``out``,
    and which (task, config) runs it ran now or found done."""

    out: Path
    summary: dict[str, Any]
    items: pd.DataFrame
    ran: list[tuple[str, str]] = field(default_factory=list)
    cached: list[tuple[str, str]] = field(default_factory=list)


def _data_hash(spec: TaskSpec, data: Path | None) -> str | None:
    if data is None or is_generated(spec):
        return None
    h = hashlib.sha256()
    for split, files in sorted(find_data_files(spec, data).items()):
        for f in files:
            h.update(f"{split}:{f.name}:".encode())
            h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()[:16]


def _config_list(configs: Sequence[str | PrecisionConfig]) -> list[PrecisionConfig]:
    out = [PRESETS[REFERENCE]]
    for c in configs:
        cfg = parse_config(c)
        if cfg not in out:
            out.append(cfg)
    return out


def _make_lm(settings: SuiteSettings, cfg: PrecisionConfig, loaded: dict[str, Any],
             progress: SuiteProgress, responder: Callable | None,
             reuse: list[dict[str, Any]] | None = None) -> Any:
    if settings.backend == "vllm":
        from ..models.fixture import FIXTURES, fixture_path
        from .lm_backend import vllm_lm

        path = str(fixture_path(settings.model)) if settings.model in FIXTURES else settings.model
        return vllm_lm(path, cfg, seed=settings.seed, max_gen_toks=settings.max_gen_toks,
                       dtype="auto" if settings.dtype == "auto" else settings.dtype,
                       tensor_parallel_size=settings.tensor_parallel_size,
                       data_parallel_size=settings.data_parallel_size)
    from .lm_backend import _DTYPES, ReplaySSMLM

    if "model" not in loaded:
        from ..models.loading import load_model

        loaded["model"], loaded["tokenizer"] = load_model(
            settings.model, device=settings.device, dtype=_DTYPES[settings.dtype])
    lm = ReplaySSMLM(pretrained=loaded["model"], tokenizer=loaded["tokenizer"], config=cfg,
                     seed=settings.seed, batch_size=settings.batch_size,
                     max_gen_toks=settings.max_gen_toks, responder=responder,
                     progress=progress.requests, reuse=reuse)
    lm.model_name = settings.model
    return lm


def _previous_generations(rdir: Path, key: dict[str, Any]) -> list[dict[str, Any]]:
    """The generation log of the finished run in ``rdir`` when it differs from ``key`` in
    ``limit`` alone (same model, config, seed, data, backend ...): its answers can be reused."""
    try:
        done = json.loads((rdir / "run.json").read_text()).get("settings") or {}
        lines = (rdir / "generations.jsonl").read_text().splitlines()
    except (OSError, ValueError):
        return []
    want = finite_json(json.loads(json.dumps(key)))
    if {k: v for k, v in done.items() if k != "limit"} != {
            k: v for k, v in want.items() if k != "limit"}:
        return []
    entries = []
    for line in lines:
        try:
            entries.append(json.loads(line))
        except ValueError:
            continue
    return entries


def _strip_samples(res: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in res.items() if k != "samples"}


def run_suite(settings: SuiteSettings, out: str | Path, *, progress: SuiteProgress | None = None,
              responder: Callable[[str, dict], str | None] | None = None,
              task_manager: Any = None, resamples: int = 10_000,
              cache: dict[str, Any] | None = None, summary: bool = True) -> SuiteResult:
    """Run every (task, config) of ``settings`` not already done in ``out``, then write
    ``items.parquet`` and ``summary.json`` over all finished runs of the model.

    ``responder`` forces continuations (tests); ``task_manager`` reuses an lm-eval
    ``TaskManager`` (building one indexes every stock task, ~10 s); ``cache`` (a dict the
    caller keeps) holds the loaded model and task managers across calls; ``summary=False``
    leaves the folder's ``items.parquet`` and ``summary.json`` to a later
    :func:`write_summary`.
    """
    out = Path(out)
    progress = progress or SuiteProgress()
    specs = [TASKS[t] for t in settings.tasks]
    configs = _config_list(settings.configs)
    data = Path(settings.data) if settings.data else None
    names = {s.key: s.lm_eval for s in specs}
    include = None
    if data is not None:
        local = write_local_tasks(data, out / "tasks", specs)
        names, include = local.names, str(local.include_path)
    generated = [s for s in specs if is_generated(s)]
    for spec in generated:
        names[spec.key] = prepare_task(spec, settings.generated(), out / "tasks")
    if generated:
        include = str(out / "tasks")
    _check_model(out, settings.model)
    loaded: dict[str, Any] = cache if cache is not None else {}
    tm_key = f"task_manager:{include}:{not all(is_generated(s) for s in specs)}"
    task_manager = task_manager or loaded.get(tm_key)
    result = SuiteResult(out, {}, pd.DataFrame())
    total = len(specs) * len(configs)
    index = 0
    for spec in specs:
        dhash = _data_hash(spec, data)
        for cfg in configs:
            index += 1
            rdir = out / "runs" / spec.key / slug(cfg.label)
            key = settings.run_key(spec.key, cfg, dhash)
            marker = rdir / "run.json"
            if marker.is_file():
                try:
                    done = json.loads(marker.read_text())
                except (OSError, ValueError):
                    done = {}
                if done.get("settings") == finite_json(json.loads(json.dumps(key))):
                    result.cached.append((spec.key, cfg.label))
                    progress.run_finished(spec.key, cfg.label, done.get("summary", {}), True,
                                          0.0)
                    continue
            progress.run_started(spec.key, cfg.label, index, total)
            t0 = time.time()
            if task_manager is None:  # indexing every stock task takes ~10 s: only if needed
                from lm_eval.tasks import TaskManager

                task_manager = loaded[tm_key] = TaskManager(  # generated tasks alone: no stock index
                    include_path=include,
                    include_defaults=not all(is_generated(s) for s in specs))
            lm = _make_lm(settings, cfg, loaded, progress, responder,
                          _previous_generations(rdir, key))
            res = shape_results(spec, run_task(
                lm, names[spec.key], task_manager=task_manager,
                max_gen_toks=None if spec.key == "ruler" else settings.max_gen_toks,
                limit=None if is_generated(spec) else settings.limit, seed=settings.seed))
            gen_log = list(getattr(lm, "generation_log", []) or [])
            items = shape_items(spec, items_from_results(
                res, spec, gen_log, model=settings.model, config=cfg.label,
                config_string=str(cfg), seed=settings.seed))
            for subtask, samples in (res.get("samples") or {}).items():
                _atomic_jsonl(rdir / "samples" / f"{slug(subtask)}.jsonl", samples)
            _atomic_jsonl(rdir / "generations.jsonl", gen_log)
            _atomic_parquet(rdir / "items.parquet", items)
            meta = {"settings": key, "lm_eval_task": names[spec.key],
                    "config_name": cfg.label}
            shape = _shape(loaded.get("model"))
            _atomic_json(rdir / "results.json", finite_json(_strip_samples(res) | {"replayssm": meta}))
            own = summarize_items(items) if len(items) else {}
            brief = {k: own.get(k) for k in ("n", "accuracy", "accuracy_raw", "truncation_rate",
                                             "invalid_rate")}
            seconds = time.time() - t0
            items_total = sum(int(v.get("original", 0))
                              for v in (res.get("n-samples") or {}).values())
            _atomic_json(marker, finite_json({
                "settings": key, "summary": brief, "seconds": seconds, "finished": time.time(),
                "lm_eval_task": names[spec.key], "subtasks": sorted(res.get("samples") or {}),
                "items_total": items_total, "ssm_shape": shape}))
            result.ran.append((spec.key, cfg.label))
            progress.run_finished(spec.key, cfg.label, brief, False, seconds)
            del lm
    if summary:
        result.items, result.summary = write_summary(out, settings, resamples=resamples)
    return result


def write_summary(out: str | Path, settings: SuiteSettings | None = None, *,
                  resamples: int = 10_000) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Write ``items.parquet`` and ``summary.json`` over every finished run under ``out``
    (with the sha256 of each parquet file); returns both."""
    out = Path(out)
    items = load_items(out)
    summary = summarize(out, settings, resamples=resamples)
    _atomic_parquet(out / "items.parquet", items)
    runs = [str((Path(m["_dir"]) / "items.parquet").relative_to(out)) for m in _markers(out)
            if (Path(m["_dir"]) / "items.parquet").is_file()]
    summary["files"] = file_records(out, ["items.parquet", *runs])
    _atomic_json(out / "summary.json", summary)
    return items, summary


def _check_model(out: Path, model: str) -> None:
    """One output folder holds one model's runs (the summary is per model)."""
    for marker in out.glob("runs/*/*/run.json"):
        try:
            other = json.loads(marker.read_text()).get("settings", {}).get("model")
        except (OSError, ValueError):
            continue
        if other is not None and other != model:
            raise ValueError(f"{out} holds results of model {other!r}; use another --out for "
                             f"{model!r}")


def _shape(model: Any) -> dict[str, Any] | None:
    if model is None:
        return None
    from ..models.registry import model_shape

    try:
        s = model_shape(model)
    except ValueError:
        return None
    return {"kind": s.kind, "heads": s.heads, "head_dim": s.head_dim, "d_state": s.d_state,
            "groups": s.groups, "layers": s.layers, "act_bytes": s.act_bytes}


def _markers(out: Path) -> list[dict[str, Any]]:
    found = []
    for marker in sorted(out.glob("runs/*/*/run.json")):
        try:
            found.append(json.loads(marker.read_text()) | {"_dir": str(marker.parent)})
        except (OSError, ValueError):
            continue
    return found


def load_items(out: str | Path) -> pd.DataFrame:
    """Every finished run's items under ``out/runs`` (runs without ``run.json`` are skipped)."""
    frames = []
    for m in _markers(Path(out)):
        path = Path(m["_dir"]) / "items.parquet"
        if path.is_file():
            frames.append(pd.read_parquet(path))
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


_ROW_NUMERIC = (
    "accuracy_raw", "ref_accuracy", "delta_se", "discordant", "flips_to_wrong",
    "flips_to_right", "answer_change_rate", "correct", "truncated", "truncation_known",
    "invalid", "unpaired_items",
)


def _row(r: dict[str, Any]) -> dict[str, Any]:
    """A paired comparison as a task result row (numbers or null besides the names)."""
    ci = r.get("accuracy_ci") or [None, None]
    dci = r.get("delta_ci") or [None, None]
    row = {"model": r["model"], "task": r["task"], "name": r["config"],
           "config": r["config_string"], "n": int(r["n"]), "accuracy": r.get("accuracy"),
           "accuracy_lo": ci[0], "accuracy_hi": ci[1], "delta": r.get("delta"),
           "delta_lo": dci[0], "delta_hi": dci[1],
           "delta_ci_method": r.get("delta_ci_method"), "mcnemar_p": r.get("mcnemar_p"),
           "flip_rate": r.get("flip_rate"), "truncation_rate": r.get("truncation_rate"),
           "invalid_rate": r.get("invalid_rate")}
    for k in _ROW_NUMERIC:
        v = r.get(k)
        row[k] = None if v is None else float(v)
    row["mcnemar_exact"] = None if r.get("mcnemar_method") is None else float(
        r["mcnemar_method"] == "exact")
    return row


def summarize(out: str | Path, settings: SuiteSettings | None = None, *,
              reference: str = REFERENCE, resamples: int = 10_000,
              level: float = 0.95) -> dict[str, Any]:
    """The task ``summary.json`` of the runs under ``out``: one row per (task, config),
    paired against ``reference`` on the items both answered."""
    out = Path(out)
    items = load_items(out)
    rows = compare(breakdown_items(items), reference=reference, resamples=resamples,
                   level=level) if len(items) else []
    markers = _markers(out)
    tasks: dict[str, dict[str, Any]] = {}
    shape = None
    for m in markers:
        st = m.get("settings", {})
        shape = shape or m.get("ssm_shape")
        if st.get("task") and st["task"] not in tasks:
            tasks[st["task"]] = {"task": st["task"], "items": m.get("items_total"),
                                 "max_gen_toks": st.get("max_gen_toks"),
                                 "lm_eval_task": m.get("lm_eval_task"),
                                 "subtasks": m.get("subtasks"), "limit": st.get("limit")}
    model = settings.model if settings is not None else (
        markers[0]["settings"]["model"] if markers else None)
    summary: dict[str, Any] = {
        "kind": "tasks",
        "schema_version": SUMMARY_VERSION,
        "model": model,
        "reference": reference,
        "seed": settings.seed if settings is not None else None,
        "level": level,
        "tasks": list(tasks.values()),
        "policy": {"truncated": "an answer that hit max_gen_toks counts as wrong in accuracy; "
                                "accuracy_raw is lm-eval's own score",
                   "mcnemar": "exact binomial below 25 discordant pairs, else chi-squared "
                              "with continuity correction",
                   "delta": "candidate minus reference accuracy (fractions); delta_lo/"
                            "delta_hi: the 95% interval of delta_ci_method (tango-score: "
                            "Tango's score interval for paired proportions)"},
        "settings": None if settings is None else {
            "model": settings.model, "tasks": list(settings.tasks),
            "configs": list(settings.configs), "limit": settings.limit,
            "max_gen_toks": settings.max_gen_toks, "seed": settings.seed,
            "data": settings.data, "backend": settings.backend, "dtype": settings.dtype},
        "results": [_row(r) for r in rows],
    }
    if shape:
        summary["ssm_shape"] = shape
    return finite_json(summary)
