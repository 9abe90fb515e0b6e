"""The long-generation task suite, run through lm-eval's own task definitions.

``gpqa_diamond`` is lm-eval's ``gpqa_diamond_cot_zeroshot``, ``mmlu_pro`` its ``mmlu_pro`` group
and ``math_l5`` its ``leaderboard_math_hard`` group: prompts, answer extraction and metrics are the
stock ones, so numbers compare with published ones. Two things are not left to lm-eval's
defaults:

* ``max_gen_toks`` reaches every task through ``gen_kwargs``; a task without it would stop at
  lm-eval's silent 256-token default and score cut-off reasoning as an answer.
* Python's ``random`` is seeded right before each task: GPQA's ``process_docs`` shuffles the
  answer choices with it, so the letters depend on whatever ran before in the process.

Offline (``data_dir``), :func:`write_local_tasks` writes wrapper YAMLs that ``include:`` the stock
task files (absolute paths found from ``lm_eval.__file__``) and only point the dataset at local
files in the hub's schema (``dataset_path: json|parquet|csv`` + ``dataset_kwargs.data_files``).
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "TASKS",
    "LocalTasks",
    "TaskDataError",
    "TaskSpec",
    "extract_answer",
    "find_data_files",
    "is_invalid",
    "resolve_tasks",
    "run_task",
    "seed_task_docs",
    "stock_task_dir",
    "write_local_tasks",
]

log = logging.getLogger(__name__)

LOCAL_SUFFIX = "_local"
"""Suffix of the wrapper task and group names written for local data."""

_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


class TaskDataError(ValueError):
    """Local task data that cannot be used (missing files, wrong schema, empty)."""


@dataclass(frozen=True)
class TaskSpec:
    """One task of the suite and how its items are scored.

    ``lm_eval`` is the stock task or group name; ``filter`` the filter whose output is the
    task's answer (lm-eval logs one sample per filter) and ``metric`` the per-item score.
    ``columns`` are the fields local data must have.
    """

    key: str
    lm_eval: str
    group: bool
    filter: str
    metric: str
    stock_dir: str
    columns: tuple[str, ...]
    splits: tuple[str, ...]
    source: str = "hub"
    """``hub``: hub data or ``--data`` files; ``generated``: the items are generated here
    (RULER, the carry-chain probe) and ``--data`` does not apply."""


TASKS: dict[str, TaskSpec] = {
    "gpqa_diamond": TaskSpec(
        "gpqa_diamond", "gpqa_diamond_cot_zeroshot", False, "flexible-extract", "exact_match",
        "gpqa/cot_zeroshot",
        ("Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
         "Incorrect Answer 3"), ("train",)),
    "mmlu_pro": TaskSpec(
        "mmlu_pro", "mmlu_pro", True, "custom-extract", "exact_match", "mmlu_pro",
        ("question", "options", "answer", "answer_index", "category"), ("test", "validation")),
    "math_l5": TaskSpec(
        "math_l5", "leaderboard_math_hard", True, "none", "exact_match", "leaderboard/math",
        ("problem", "solution", "level"), ("test",)),
    "ruler": TaskSpec(
        "ruler", "ruler", True, "none", "score", "ruler", (), ("test",), "generated"),
    "carry_chain": TaskSpec(
        "carry_chain", "carry_chain", False, "none", "exact_match", "", (), ("test",),
        "generated"),
}
"""The suite, keyed by the names the CLI and reports use."""

MATH_TYPES = {
    "algebra": "Algebra",
    "counting_and_probability": "Counting & Probability",
    "geometry": "Geometry",
    "intermediate_algebra": "Intermediate Algebra",
    "number_theory": "Number Theory",
    "prealgebra": "Prealgebra",
    "precalculus": "Precalculus",
}
"""MATH subject configs on the hub (``dataset_name`` of each stock subtask) -> ``type`` values."""


def stock_task_dir() -> Path:
    """lm-eval's bundled ``tasks`` folder."""
    import lm_eval

    return Path(lm_eval.__file__).resolve().parent / "tasks"


def resolve_tasks(names: Sequence[str] | str) -> list[TaskSpec]:
    """Task keys (a list or a comma-separated string) to specs; one clear error per unknown."""
    if isinstance(names, str):
        names = names.split(",")
    out = []
    for n in (n.strip() for n in names):
        if not n:
            continue
        if n not in TASKS:
            raise ValueError(f"unknown task {n!r}; tasks: {', '.join(TASKS)}")
        if TASKS[n] not in out:
            out.append(TASKS[n])
    if not out:
        raise ValueError(f"no tasks given; tasks: {', '.join(TASKS)}")
    return out


# ----------------------------------------------------------------------------- local data
def _candidates(data_dir: Path, stems: Sequence[str]) -> list[Path]:
    found: list[Path] = []
    for stem in stems:
        for suffix in _FORMATS:
            found += sorted(data_dir.glob(f"{stem}{suffix}"))
    seen: set[Path] = set()
    return [p for p in found if not (p in seen or seen.add(p))]


def find_data_files(spec: TaskSpec, data_dir: str | Path) -> dict[str, list[Path]]:
    """Local files of ``spec`` per split.

    Accepted layouts (``.jsonl``/``.json``/``.parquet``/``.csv``; ``*`` matches shard names such
    as ``test-00000-of-00001``):

    * gpqa_diamond: ``gpqa_diamond.*``, ``gpqa/gpqa_diamond.*`` or ``gpqa_diamond/train*``
      (split ``train``, the hub's only split);
    * mmlu_pro: ``mmlu_pro/{test,validation}*`` or ``mmlu_pro/data/{test,validation}*``;
    * math_l5: ``math/test*`` / ``math/data/test*`` (one file, subjects in ``type``) or
      ``math/<subject>/test*`` per hub subject config (``algebra``, ``number_theory``, ...).
    """
    d = Path(data_dir)
    if spec.key == "gpqa_diamond":
        files = _candidates(d, ["gpqa_diamond", "gpqa/gpqa_diamond", "gpqa_diamond/train*",
                                "gpqa_diamond/data/train*"])
        return {"train": files[:1]} if files else {}
    if spec.key == "mmlu_pro":
        out = {}
        for split in spec.splits:
            files = _candidates(d, [f"mmlu_pro/{split}*", f"mmlu_pro/data/{split}*"])
            if files:
                out[split] = files
        return out
    files = _candidates(d, ["math/test*", "math/data/test*", "math_l5/test*", "math_l5"])
    if files:
        return {"test": files}
    out = {}
    for sub in MATH_TYPES:
        sfiles = _candidates(d, [f"math/{sub}/test*", f"math/{sub}/data/test*"])
        if sfiles:
            out[f"test:{sub}"] = sfiles
    return out


def _read_frame(files: Sequence[Path]):
    import pandas as pd

    frames = []
    for f in files:
        kind = _FORMATS[f.suffix]
        if kind == "parquet":
            frames.append(pd.read_parquet(f))
        elif kind == "csv":
            frames.append(pd.read_csv(f))
        else:
            frames.append(pd.read_json(f, lines=f.suffix == ".jsonl"))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _builder(files: Sequence[Path]) -> str:
    kinds = {_FORMATS[f.suffix] for f in files}
    if len(kinds) != 1:
        raise TaskDataError(f"mixed file formats for one dataset: {[str(f) for f in files]}")
    return kinds.pop()


def _check_columns(spec: TaskSpec, frame, where: str) -> None:
    missing = [c for c in spec.columns if c not in frame.columns]
    if missing:
        raise TaskDataError(f"{where} lacks the column(s) {missing} of the hub's {spec.key} "
                            f"schema (needs {list(spec.columns)})")


@dataclass
class LocalTasks:
    """Wrapper tasks written for local data: ``include_path`` for lm-eval's TaskManager and
    the task (or group) name to run per suite key."""

    include_path: Path
    names: dict[str, str]
    subtasks: dict[str, list[str]]


def _dump(path: Path, cfg: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # concurrent writers never share it
    tmp.write_text(yaml.safe_dump(cfg, sort_keys=False, allow_unicode=True))
    tmp.replace(path)


def _wrapper(include: Path, task: str, files: dict[str, Sequence[Path]]) -> dict[str, Any]:
    builder = _builder([f for fs in files.values() for f in fs])
    return {
        "include": str(include),
        "task": task,
        "dataset_path": builder,
        "dataset_name": None,
        "dataset_kwargs": {"data_files": {s: [str(f.resolve()) for f in fs]
                                          for s, fs in files.items()}},
    }


def _group_members(stock_dir: Path, group_yaml: str) -> tuple[dict[str, Any], list[str]]:
    cfg = yaml.safe_load((stock_dir / group_yaml).read_text())
    return cfg, list(cfg["task"])


def _yaml_of(stock_dir: Path, task: str) -> Path:
    for p in sorted(stock_dir.glob("*.yaml")):
        try:
            text = p.read_text()
        except OSError:
            continue
        if f"task: {task}\n" in text or f'task: "{task}"' in text:
            return p
    raise TaskDataError(f"stock task {task!r} not found under {stock_dir}")


def _split_math(frame, out_dir: Path) -> dict[str, list[Path]]:
    if "type" not in frame.columns:
        raise TaskDataError("a single MATH file needs the 'type' column (subject) of the hub's "
                            "schema to be split into lm-eval's subject tasks")
    files = {}
    for sub, type_name in MATH_TYPES.items():
        part = frame[frame["type"] == type_name]
        if len(part):
            path = out_dir / "data" / "math" / f"{sub}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            part.to_json(tmp, orient="records", lines=True, force_ascii=False)
            tmp.replace(path)
            files[sub] = [path]
    return files


def write_local_tasks(data_dir: str | Path, out_dir: str | Path,
                      specs: Sequence[TaskSpec] | None = None) -> LocalTasks:
    """Write wrapper task YAMLs for the local data in ``data_dir`` into ``out_dir``.

    Each wrapper ``include:``s the stock YAML and overrides only the dataset location; groups
    (MMLU-Pro, MATH) get a wrapper group with the stock aggregation over the subjects present
    in the data (lm-eval cannot run a subtask with no documents).
    """
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    specs = [s for s in (specs if specs is not None else TASKS.values()) if s.source == "hub"]
    if not data_dir.is_dir():
        raise TaskDataError(f"--data {data_dir} is not a folder")
    root = stock_task_dir()
    names: dict[str, str] = {}
    subtasks: dict[str, list[str]] = {}
    for spec in specs:
        files = find_data_files(spec, data_dir)
        sdir = root / spec.stock_dir
        if spec.key == "gpqa_diamond":
            if not files:
                raise TaskDataError(f"no GPQA-Diamond file in {data_dir} (gpqa_diamond.jsonl, "
                                    "gpqa/gpqa_diamond.csv, ...)")
            _check_columns(spec, _read_frame(files["train"]), str(files["train"][0]))
            name = spec.lm_eval + LOCAL_SUFFIX
            _dump(out_dir / f"{name}.yaml",
                  _wrapper(sdir / f"{spec.lm_eval}.yaml", name, files))
            names[spec.key], subtasks[spec.key] = name, [name]
        elif spec.key == "mmlu_pro":
            if set(files) != {"test", "validation"}:
                raise TaskDataError(f"MMLU-Pro needs test and validation files in {data_dir}/"
                                    f"mmlu_pro/ (found splits {sorted(files)})")
            test, val = _read_frame(files["test"]), _read_frame(files["validation"])
            _check_columns(spec, test, "mmlu_pro test")
            _check_columns(spec, val, "mmlu_pro validation")
            group_cfg, members = _group_members(sdir, "_mmlu_pro.yaml")
            present = set(test["category"])
            wrappers = []
            for member in members:
                subject = member.removeprefix("mmlu_pro_").replace("_", " ")
                if subject not in present:
                    continue
                shots = int((val["category"] == subject).sum())
                if shots < 5:
                    raise TaskDataError(f"MMLU-Pro category {subject!r} has {shots} validation "
                                        "rows; its 5-shot prompt needs at least 5")
                name = member + LOCAL_SUFFIX
                _dump(out_dir / "mmlu_pro" / f"{name}.yaml",
                      _wrapper(sdir / f"{member}.yaml", name, files))
                wrappers.append(name)
            if not wrappers:
                raise TaskDataError("no MMLU-Pro test row has a category of the stock subjects")
            missing = sorted({m.removeprefix("mmlu_pro_") for m in members}
                             - {w.removeprefix("mmlu_pro_").removesuffix(LOCAL_SUFFIX)
                                for w in wrappers})
            if missing:
                log.warning("MMLU-Pro local data has no test rows for: %s", ", ".join(missing))
            gname = spec.lm_eval + LOCAL_SUFFIX
            _dump(out_dir / "mmlu_pro" / f"{gname}.yaml", _group(group_cfg, gname, wrappers))
            names[spec.key], subtasks[spec.key] = gname, wrappers
        else:
            if not files:
                raise TaskDataError(f"no MATH file in {data_dir} (math/test.jsonl with a 'type' "
                                    "column, or math/<subject>/test*.parquet)")
            if "test" in files:
                frame = _read_frame(files["test"])
                _check_columns(spec, frame, "math test")
                by_subject = _split_math(frame, out_dir)
            else:
                by_subject = {k.split(":", 1)[1]: v for k, v in files.items()}
                for sub, fs in by_subject.items():
                    _check_columns(spec, _read_frame(fs), f"math/{sub}")
            group_cfg, members = _group_members(sdir, "_leaderboard_math.yaml")
            wrappers = []
            for member in members:
                stock = _yaml_of(sdir, member)
                sub = yaml.safe_load(stock.read_text()).get("dataset_name")
                if sub not in by_subject:
                    continue
                frame = _read_frame(by_subject[sub])
                if not (frame["level"] == "Level 5").any():
                    continue
                name = member + LOCAL_SUFFIX
                _dump(out_dir / "math" / f"{name}.yaml",
                      _wrapper(stock, name, {"test": by_subject[sub]}))
                wrappers.append(name)
            if not wrappers:
                raise TaskDataError("the MATH data has no 'Level 5' row of a known subject")
            gname = spec.lm_eval + LOCAL_SUFFIX
            _dump(out_dir / "math" / f"{gname}.yaml", _group(group_cfg, gname, wrappers))
            names[spec.key], subtasks[spec.key] = gname, wrappers
    return LocalTasks(out_dir, names, subtasks)


def _group(stock: dict[str, Any], name: str, members: list[str]) -> dict[str, Any]:
    cfg = {"group": name, "task": members}
    for key in ("aggregate_metric_list", "metadata"):
        if key in stock:
            cfg[key] = stock[key]
    return cfg


# ----------------------------------------------------------------------------- running
def _seeded(fn: Callable, seed: int) -> Callable:
    """``fn`` with Python's ``random`` seeded before every call (its state restored after)."""

    def wrapped(dataset: Any) -> Any:
        state = random.getstate()
        random.seed(seed)
        try:
            return fn(dataset)
        finally:
            random.setstate(state)

    wrapped.__wrapped__ = fn
    return wrapped


def seed_task_docs(task: Any, seed: int) -> None:
    """Make a task's ``process_docs`` draw from ``random.seed(seed)`` on every call.

    lm-eval runs ``process_docs`` once to build the prompts and again to score them; GPQA's
    shuffles the choices with the global ``random``, so without this the second shuffle (the
    one the target letter comes from) differs from the prompt's unless ``datasets`` happens to
    serve the first one from its cache, which in turn ignores the seed.
    """
    cfg = task.config
    if getattr(cfg, "process_docs", None) is not None:
        cfg.process_docs = _seeded(cfg.process_docs, seed)
    fs = getattr(task, "fewshot_cfg", None)
    if fs is not None and getattr(fs, "process_docs", None) is not None:
        fs.process_docs = _seeded(fs.process_docs, seed)


def run_task(lm: Any, task_name: str, *, task_manager: Any, max_gen_toks: int | None,
             limit: int | float | None = None, seed: int = 0, bootstrap_iters: int = 0,
             extra_gen_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """One lm-eval task (or group) through ``simple_evaluate`` with sample logging.

    Python's ``random`` is seeded with ``seed`` right before the task and before each of its
    ``process_docs`` calls (:func:`seed_task_docs`); numpy, torch and the few-shot sampler get
    the same seed. ``datasets`` caching is off so a cached shuffle from a run with another seed
    is never reused. ``max_gen_toks=None`` keeps each task's own limit (RULER's items are
    sized to leave exactly that many tokens of their context length).
    """
    import datasets
    from lm_eval import simple_evaluate

    if max_gen_toks is not None and max_gen_toks < 1:
        raise ValueError(f"max_gen_toks must be >= 1, got {max_gen_toks}")
    datasets.disable_caching()
    gen_kwargs = ({} if max_gen_toks is None else {"max_gen_toks": int(max_gen_toks)}) | (
        extra_gen_kwargs or {})
    random.seed(seed)
    loaded = task_manager.load([task_name])
    for task in loaded["tasks"].values():
        seed_task_docs(task, seed)
    top = loaded["groups"].get(task_name) or loaded["tasks"][task_name]
    random.seed(seed)
    res = simple_evaluate(
        model=lm, tasks=[top], task_manager=task_manager, limit=limit,
        gen_kwargs=gen_kwargs or None, log_samples=True, bootstrap_iters=bootstrap_iters,
        random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
        fewshot_random_seed=seed,
    )
    if res is None:
        raise RuntimeError(f"lm-eval returned no results for {task_name}")
    return res


# ----------------------------------------------------------------------------- extraction
INVALID_MARKERS = ("[invalid]", "[invalidanswer]")
"""What lm-eval's regex filters and the MATH helpers return when no answer is found."""


def _math_answer(response: str) -> str | None:
    from math_verify import parse

    try:
        parsed = parse(response)
    except Exception:  # noqa: BLE001 - math-verify raises on odd LaTeX; that is no answer
        return None
    return str(parsed[-1]) if parsed else None


def extract_answer(spec: TaskSpec, filtered: str, response: str) -> str | None:
    """The answer the task's own extraction reads from a response, ``None`` if there is none:
    the filter output for GPQA and MMLU-Pro (the regex filters' fallback means none), the
    math-verify parse that MATH's scorer uses (its string form)."""
    if spec.key in ("math_l5", "carry_chain"):
        return _math_answer(response)
    if not isinstance(filtered, str) or not filtered.strip():
        return None
    return None if filtered.strip() in INVALID_MARKERS else filtered.strip()


def is_invalid(spec: TaskSpec, filtered: str, response: str) -> bool:
    """Whether a response has no extractable answer (see :func:`extract_answer`)."""
    return extract_answer(spec, filtered, response) is None
