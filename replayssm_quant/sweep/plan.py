"""A sweep plan: its YAML schema, its checks, and its expansion into units.

A plan names models, precision configs, a drift section (data, documents, tokens) and an eval
section (tasks and their options). Everything a plan can get wrong is found here, before any
unit runs or Ray starts: unknown models, configs or tasks, missing data, bad YAML (read with the
safe loader, so ``!!python`` tags are refused).

Units (:class:`Unit`) are what Ray schedules. Drift: model x config x document shard, where the
first config's unit of a shard computes the shard's FP32 reference and keeps it on disk for the
other configs' units (which wait for it). Eval: model x config x task, where the reference
config's unit (``fp32``) runs first. After all units of one result folder finish, one summary
unit writes its ``summary.json`` through the library's own summarizing code.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = ["DriftSection", "EvalSection", "ModelEntry", "Plan", "PlanError", "Unit",
           "expand", "load_plan", "parse_plan"]


class PlanError(ValueError):
    """A plan that cannot run; the message names the key and the bad value."""


@dataclass(frozen=True)
class ModelEntry:
    """One model and the resources each of its units asks Ray for (None: the default)."""

    name: str
    num_cpus: float | None = None
    num_gpus: float | None = None


@dataclass(frozen=True)
class DriftSection:
    """The options of ``replayssm-quant drift`` that a sweep passes on, plus the shard size."""

    configs: tuple[str, ...]
    data: str = "gutenberg"
    docs: int = 1
    max_tokens: int = 2048
    prefill: int = 128
    seed: int = 0
    reference: str = "exact"
    keep_reference: bool = False
    docs_per_unit: int = 1


@dataclass(frozen=True)
class EvalSection:
    """The options of ``replayssm-quant eval`` that a sweep passes on."""

    tasks: tuple[str, ...]
    configs: tuple[str, ...]
    limit: int | float | None = None
    max_gen_toks: int = 32768
    seed: int = 0
    data: str | None = None
    backend: str = "hf"
    dtype: str = "float32"
    batch_size: int = 8
    resamples: int = 10_000
    context_lengths: tuple[int, ...] = (2048, 4096)
    ruler_subtasks: tuple[str, ...] | None = None
    carry_terms: int = 48
    carry_rule: str = "table"
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1


@dataclass(frozen=True)
class Plan:
    """A checked plan; paths are absolute."""

    models: tuple[ModelEntry, ...]
    out: Path
    drift: DriftSection | None
    eval: EvalSection | None
    device: str = "auto"
    dtype: str = "auto"
    threads: int = 1
    num_cpus: float = 1.0
    num_gpus: float | None = None


@dataclass(frozen=True)
class Unit:
    """One schedulable piece of work. ``after``: ids of the units it waits for."""

    id: str
    kind: str  # "drift", "eval", "drift-summary", "eval-summary"
    model: str
    folder: Path
    config: str | None = None
    docs: tuple[int, ...] = ()
    task: str | None = None
    after: tuple[str, ...] = ()
    keeps_reference: bool = False


_TOP_KEYS = {"models", "configs", "out", "drift", "eval", "device", "dtype", "threads",
             "resources"}
_DRIFT_KEYS = {"configs", "data", "docs", "max_tokens", "prefill", "seed", "reference",
               "keep_reference", "docs_per_unit"}
_EVAL_KEYS = {"tasks", "configs", "limit", "max_gen_toks", "seed", "data", "backend", "dtype",
              "batch_size", "resamples", "context_lengths", "ruler_subtasks", "carry_terms",
              "carry_rule",
              "tensor_parallel_size", "data_parallel_size"}
_BUILTIN_DATA = ("gutenberg", "pg19", "self")


def load_plan(path: str | Path) -> Plan:
    """Read and check the plan at ``path`` (relative paths in it are relative to its folder)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise PlanError(f"plan {path}: no such file")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.constructor.ConstructorError as e:
        raise PlanError(f"plan {path}: a tag the safe YAML loader refuses "
                        f"({' '.join(str(e.problem).split())}); plans hold plain data only"
                        ) from None
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        raise PlanError(f"plan {path}: malformed YAML{at}: "
                        f"{getattr(e, 'problem', None) or e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise PlanError(f"plan {path}: cannot read it: {e}") from None
    return parse_plan(raw, base=path.parent.resolve(), source=str(path))


def parse_plan(raw: Any, *, base: Path, source: str = "plan") -> Plan:
    """Check a plan already read from YAML; every problem is a :class:`PlanError`."""
    if not isinstance(raw, dict):
        raise PlanError(f"{source}: a plan is a mapping with models, configs, drift and/or eval")
    _no_unknown(raw, _TOP_KEYS, source)
    models = _models(raw.get("models"), source)
    configs = raw.get("configs")
    if raw.get("drift") is None and raw.get("eval") is None:
        raise PlanError(f"{source}: nothing to run; give a drift and/or an eval section")
    out = raw.get("out", "sweep-out")
    if not isinstance(out, str) or not out.strip():
        raise PlanError(f"{source}: out must be a folder path, got {out!r}")
    res = raw.get("resources") or {}
    if not isinstance(res, dict):
        raise PlanError(f"{source}: resources must be a mapping (num_cpus, num_gpus)")
    _no_unknown(res, {"num_cpus", "num_gpus"}, f"{source}: resources")
    threads = _int(raw.get("threads", 1), "threads", source, lo=1)
    plan = Plan(
        models=models, out=_path(out, base),
        drift=_drift(raw.get("drift"), configs, base, source),
        eval=_eval(raw.get("eval"), configs, base, source),
        device=_str(raw.get("device", "auto"), "device", source),
        dtype=_str(raw.get("dtype", "auto"), "dtype", source), threads=threads,
        num_cpus=_num(res.get("num_cpus", 1), "resources.num_cpus", source, lo=0),
        num_gpus=(None if res.get("num_gpus") is None
                  else _num(res["num_gpus"], "resources.num_gpus", source, lo=0)))
    _check_names(plan, source)
    return plan


# ----------------------------------------------------------------------------------- sections
def _models(raw: Any, source: str) -> tuple[ModelEntry, ...]:
    if not isinstance(raw, list) or not raw:
        raise PlanError(f"{source}: models must be a non-empty list")
    out = []
    for m in raw:
        if isinstance(m, str):
            out.append(ModelEntry(m))
            continue
        if not isinstance(m, dict) or not isinstance(m.get("name"), str):
            raise PlanError(f"{source}: a model is a name or a mapping with name (and "
                            f"num_cpus, num_gpus), got {m!r}")
        _no_unknown(m, {"name", "num_cpus", "num_gpus"}, f"{source}: model {m['name']}")
        out.append(ModelEntry(
            m["name"],
            None if m.get("num_cpus") is None else _num(m["num_cpus"], "num_cpus", source, lo=0),
            None if m.get("num_gpus") is None else _num(m["num_gpus"], "num_gpus", source, lo=0)))
    names = [m.name for m in out]
    if len(set(names)) != len(names):
        raise PlanError(f"{source}: a model is listed twice: {names}")
    return tuple(out)


def _drift(raw: Any, configs: Any, base: Path, source: str) -> DriftSection | None:
    if raw is None:
        return None
    where = _section(raw, _DRIFT_KEYS, f"{source}: drift")
    data = _str(raw.get("data", "gutenberg"), "drift.data", source)
    if data.split(":")[0] not in _BUILTIN_DATA:
        local = _path(data, base)
        if not local.exists():
            raise PlanError(f"{where}.data {data}: no such file or folder ({local}); use "
                            "gutenberg, pg19[:REPO[:SPLIT]], self:N or a .txt/.parquet/.jsonl "
                            "file or folder")
        data = str(local)
    max_tokens = _int(raw.get("max_tokens", 2048), "drift.max_tokens", source, lo=2)
    prefill = _int(raw.get("prefill", 128), "drift.prefill", source, lo=0)
    if prefill + 2 > max_tokens:
        raise PlanError(f"{where}.prefill {prefill} must leave 2 tokens of max_tokens "
                        f"{max_tokens}")
    reference = _str(raw.get("reference", "exact"), "drift.reference", source)
    if reference not in ("exact", "fp32"):
        raise PlanError(f"{where}.reference must be exact or fp32, got {reference!r}")
    return DriftSection(
        configs=_configs(raw.get("configs", configs), f"{where}.configs"), data=data,
        docs=_int(raw.get("docs", 1), "drift.docs", source, lo=1), max_tokens=max_tokens,
        prefill=prefill, seed=_int(raw.get("seed", 0), "drift.seed", source, lo=0),
        reference=reference, keep_reference=bool(raw.get("keep_reference", False)),
        docs_per_unit=_int(raw.get("docs_per_unit", 1), "drift.docs_per_unit", source, lo=1))


def _eval(raw: Any, configs: Any, base: Path, source: str) -> EvalSection | None:
    if raw is None:
        return None
    where = _section(raw, _EVAL_KEYS, f"{source}: eval")
    tasks = raw.get("tasks")
    if isinstance(tasks, str):
        tasks = [t.strip() for t in tasks.split(",") if t.strip()]
    if not isinstance(tasks, list) or not tasks or not all(isinstance(t, str) for t in tasks):
        raise PlanError(f"{where}.tasks must be a non-empty list of task names")
    data = raw.get("data")
    if data is not None:
        local = _path(_str(data, "eval.data", source), base)
        if not local.is_dir():
            raise PlanError(f"{where}.data {data}: no such folder ({local})")
        data = str(local)
    limit = raw.get("limit")
    if limit is not None:
        limit = _num(limit, "eval.limit", source, lo=0)
        if limit <= 0:
            raise PlanError(f"{where}.limit must be > 0")
        limit = int(limit) if limit >= 1 else float(limit)
    backend = _str(raw.get("backend", "hf"), "eval.backend", source)
    if backend not in ("hf", "vllm"):
        raise PlanError(f"{where}.backend must be hf or vllm, got {backend!r}")
    lengths = raw.get("context_lengths", [2048, 4096])
    if isinstance(lengths, (int, str)):
        lengths = [int(x) for x in str(lengths).split(",")]
    subtasks = raw.get("ruler_subtasks")
    if isinstance(subtasks, str):
        subtasks = [s.strip() for s in subtasks.split(",") if s.strip()]
    return EvalSection(
        tasks=tuple(tasks), configs=_configs(raw.get("configs", configs), f"{where}.configs"),
        limit=limit, max_gen_toks=_int(raw.get("max_gen_toks", 32768), "eval.max_gen_toks",
                                       source, lo=1),
        seed=_int(raw.get("seed", 0), "eval.seed", source, lo=0), data=data, backend=backend,
        dtype=_str(raw.get("dtype", "float32"), "eval.dtype", source),
        batch_size=_int(raw.get("batch_size", 8), "eval.batch_size", source, lo=1),
        resamples=_int(raw.get("resamples", 10_000), "eval.resamples", source, lo=1),
        context_lengths=tuple(int(n) for n in lengths),
        ruler_subtasks=tuple(subtasks) if subtasks else None,
        carry_terms=_int(raw.get("carry_terms", 48), "eval.carry_terms", source, lo=2),
        carry_rule=_carry_rule(raw.get("carry_rule", "table"), source),
        tensor_parallel_size=_int(raw.get("tensor_parallel_size", 1),
                                  "eval.tensor_parallel_size", source, lo=1),
        data_parallel_size=_int(raw.get("data_parallel_size", 1), "eval.data_parallel_size",
                                source, lo=1))


def _check_names(plan: Plan, source: str) -> None:
    """Models, configs and tasks exist (the cheap checks the single commands make first)."""
    from ..evals.tasks import resolve_tasks
    from ..models.loading import check_model
    from ..precision import parse_config

    for m in plan.models:
        try:
            check_model(m.name)
            _check_hub_model(m.name)
        except Exception as e:  # ModelUnavailable, UnsupportedArchitecture, hub errors
            raise PlanError(f"{source}: model {m.name}: {' '.join(str(e).split())}") from None
    for section, name in ((plan.drift, "drift"), (plan.eval, "eval")):
        if section is None:
            continue
        for c in section.configs:
            try:
                parse_config(c)
            except ValueError as e:
                raise PlanError(f"{source}: {name}.configs: {' '.join(str(e).split())}"
                                ) from None
    if plan.eval is not None:
        try:
            resolve_tasks(list(plan.eval.tasks))
        except ValueError as e:
            raise PlanError(f"{source}: eval.tasks: {e}") from None


def _check_hub_model(name: str) -> None:
    """A hub id's config, from the hub or its cache (offline): a typo would otherwise surface in
    every unit, after Ray started. Fixtures, local folders and random: models pass."""
    from types import SimpleNamespace

    from ..models.fixture import FIXTURES
    from ..models.registry import architecture

    if name in FIXTURES or name.startswith("random:") or Path(name).expanduser().exists():
        return
    import json

    from huggingface_hub import hf_hub_download

    try:
        config = json.loads(Path(hf_hub_download(name, "config.json")).read_text())
    except Exception as e:  # noqa: BLE001 - any hub error means the model cannot be loaded
        raise PlanError(f"not a bundled fixture, local folder or reachable hub model "
                        f"({type(e).__name__})") from None
    architecture(SimpleNamespace(model_type=config.get("model_type")))


# ----------------------------------------------------------------------------------- expansion
def model_slug(name: str) -> str:
    """The sub-folder of a model in the plan's ``out`` (as ``drift`` names it for several)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "model"


def expand(plan: Plan) -> list[Unit]:
    """Every unit of ``plan``, each after the units it waits for."""
    units: list[Unit] = []
    for m in plan.models:
        root = plan.out / model_slug(m.name)
        if plan.drift is not None:
            units += _drift_units(m.name, root / "drift", plan.drift)
        if plan.eval is not None:
            units += _eval_units(m.name, root / "eval", plan.eval)
    return units


def _drift_units(model: str, folder: Path, d: DriftSection) -> list[Unit]:
    units: list[Unit] = []
    for lo in range(0, d.docs, d.docs_per_unit):
        docs = tuple(range(lo, min(d.docs, lo + d.docs_per_unit)))
        shard = f"doc{docs[0]}" if len(docs) == 1 else f"docs{docs[0]}-{docs[-1]}"
        first = f"{model}/drift/{shard}/{d.configs[0]}"
        for i, cfg in enumerate(d.configs):
            units.append(Unit(f"{model}/drift/{shard}/{cfg}", "drift", model, folder, config=cfg,
                              docs=docs, after=() if i == 0 else (first,),
                              keeps_reference=i == 0))
    ids = tuple(u.id for u in units)
    units.append(Unit(f"{model}/drift/summary", "drift-summary", model, folder, after=ids))
    return units


def _eval_units(model: str, folder: Path, e: EvalSection) -> list[Unit]:
    from ..evals.suite import REFERENCE

    units: list[Unit] = []
    others = [c for c in e.configs if c != REFERENCE]
    for task in e.tasks:
        first = f"{model}/eval/{task}/{REFERENCE}"
        units.append(Unit(first, "eval", model, folder, config=REFERENCE, task=task))
        units += [Unit(f"{model}/eval/{task}/{c}", "eval", model, folder, config=c, task=task,
                       after=(first,)) for c in others]
    ids = tuple(u.id for u in units)
    units.append(Unit(f"{model}/eval/summary", "eval-summary", model, folder, after=ids))
    return units


# ----------------------------------------------------------------------------------- readers
def _section(raw: Any, allowed: set[str], where: str) -> str:
    """Check that a plan section is a mapping of known keys; returns ``where`` for messages."""
    if not isinstance(raw, dict):
        raise PlanError(f"{where} must be a mapping")
    _no_unknown(raw, allowed, where)
    return where


def _no_unknown(raw: dict, allowed: set[str], where: str) -> None:
    unknown = sorted(str(k) for k in raw if k not in allowed)
    if unknown:
        raise PlanError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: "
                        f"{', '.join(sorted(allowed))}")


def _configs(raw: Any, where: str) -> tuple[str, ...]:
    from ..precision import split_configs

    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not raw or not all(isinstance(c, str) for c in raw):
        raise PlanError(f"{where} must be a non-empty list of configs (presets or "
                        "'ckpt=..,read=..,L=..' strings)")
    out: list[str] = []
    for c in split_configs(raw):
        if c not in out:
            out.append(c)
    return tuple(out)


def _path(text: str, base: Path) -> Path:
    p = Path(text).expanduser()
    return p if p.is_absolute() else (base / p).resolve()


def _str(raw: Any, key: str, source: str) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise PlanError(f"{source}: {key} must be a string, got {raw!r}")
    return raw.strip()


def _carry_rule(raw: Any, source: str) -> str:
    from ..evals.carry_chain import RULES

    rule = _str(raw, "eval.carry_rule", source)
    if rule not in RULES:
        raise PlanError(f"{source}: eval.carry_rule must be one of {', '.join(RULES)}, got {rule!r}")
    return rule


def _num(raw: Any, key: str, source: str, *, lo: float) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw) \
            or raw < lo:
        raise PlanError(f"{source}: {key} must be a number >= {lo:g}, got {raw!r}")
    return float(raw)


def _int(raw: Any, key: str, source: str, *, lo: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < lo:
        raise PlanError(f"{source}: {key} must be an integer >= {lo}, got {raw!r}")
    return raw
