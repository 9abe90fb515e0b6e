"""RULER through lm-eval's own task definitions, at chosen context lengths, offline where it can be.

lm-eval 0.4.13 ships NVIDIA's RULER (``lm_eval/tasks/ruler/``): every subtask builds its items at
load time from a tokenizer and ``metadata.max_seq_lengths``, with the prompt, ``gen_prefix`` and
``string_match_all`` scoring in the stock YAMLs. The wrappers written here ``include:`` those
YAMLs unmodified and change three things:

* ``custom_dataset`` is :func:`dataset`, which calls the stock generator function of the subtask
  (``niah_utils.niah_single_1``, ``vt_utils.get_vt_dataset``, ...) once per length with its item
  count (500, fixed in the stock code) replaced by ``num_samples`` and Python's and numpy's
  ``random`` seeded, so every config of a run sees the same items;
* ``metric_list`` adds the requested lengths to the stock ones (the stock list starts at 4096);
* ``metadata`` carries the lengths, the tokenizer (a hub id or a local folder), the count and
  the seed.

Offline: ``niah_single_1`` (the repeated "grass is green" haystack), ``niah_multikey_2`` and
``niah_multikey_3`` (haystacks of other needles) and ``vt`` (variable tracking in repeated noise)
are fully synthetic. The other NIAH subtasks use the Paul Graham essay haystack from the hub
and nltk's ``punkt_tab`` sentence splitter. RULER's preparation module imports ``nltk`` and
``wonderwords`` and calls ``nltk.download("punkt_tab")`` at import; :func:`import_stock_modules`
skips that download when only synthetic subtasks are asked for (none of them splits sentences).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import io
import logging
import math
import os
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "DEFAULT_CONTEXT_LENGTHS",
    "DEFAULT_SUBTASKS",
    "RULER_SUBTASKS",
    "STOCK_NUM_SAMPLES",
    "RulerSubtask",
    "check_context_lengths",
    "dataset",
    "import_stock_modules",
    "lengths_for",
    "model_context_limit",
    "num_samples_for",
    "parse_context_lengths",
    "plan",
    "resolve_subtasks",
    "ruler_docs",
    "split_by_length",
    "tokenizer_source",
    "write_ruler_tasks",
]

log = logging.getLogger(__name__)

DEFAULT_CONTEXT_LENGTHS = (2048, 4096)
STOCK_NUM_SAMPLES = 500
"""Items per length that the stock generator functions ask for."""

GROUP_NAME = "ruler_local"
WRAPPER_SUFFIX = "_local"


@dataclass(frozen=True)
class RulerSubtask:
    """A RULER subtask: its stock task name and YAML, the stock generator function (module,
    name) and the count-taking function inside it, and whether it needs the hub."""

    key: str
    task: str
    yaml: str
    module: str
    function: str
    sampler: str
    haystack: str
    min_length: int = 512

    @property
    def offline(self) -> bool:
        return self.haystack != "essay"


def _niah(key: str, haystack: str) -> RulerSubtask:
    return RulerSubtask(key, key, f"{key}.yaml", "niah_utils", key, "generate_samples", haystack)


RULER_SUBTASKS: dict[str, RulerSubtask] = {
    "niah_single_1": _niah("niah_single_1", "repeat"),
    "niah_single_2": _niah("niah_single_2", "essay"),
    "niah_single_3": _niah("niah_single_3", "essay"),
    "niah_multikey_1": _niah("niah_multikey_1", "essay"),
    "niah_multikey_2": _niah("niah_multikey_2", "needle"),
    "niah_multikey_3": _niah("niah_multikey_3", "needle"),
    "niah_multivalue": _niah("niah_multivalue", "essay"),
    "niah_multiquery": _niah("niah_multiquery", "essay"),
    "vt": RulerSubtask("vt", "ruler_vt", "vt.yaml", "vt_utils", "get_vt_dataset",
                       "sys_vartrack_w_noise_random", "noise", min_length=1024),
}
"""The RULER subtasks on offer, by the key the CLI and results use (``cwe``, ``fwe`` and the QA
subtasks are not offered: their data come from the hub in ways this wrapper does not size)."""

DEFAULT_SUBTASKS = ("niah_single_1", "niah_multikey_2", "niah_multikey_3", "vt")
"""The synthetic subtasks: no hub, no nltk data."""

HUB_SUBTASKS = tuple(k for k, s in RULER_SUBTASKS.items() if not s.offline)


def resolve_subtasks(names: Sequence[str] | str | None) -> tuple[str, ...]:
    """Subtask keys (list or comma-separated string; None: the synthetic ones); an unknown one
    is a ``ValueError`` naming the ones on offer."""
    if names is None:
        return DEFAULT_SUBTASKS
    if isinstance(names, str):
        names = names.split(",")
    out: list[str] = []
    for n in (n.strip() for n in names):
        if not n:
            continue
        if n not in RULER_SUBTASKS:
            raise ValueError(f"unknown RULER subtask {n!r}; subtasks: {', '.join(RULER_SUBTASKS)}")
        if n not in out:
            out.append(n)
    if not out:
        raise ValueError(f"no RULER subtasks given; subtasks: {', '.join(RULER_SUBTASKS)}")
    return tuple(out)


def parse_context_lengths(text: str | Sequence[int]) -> tuple[int, ...]:
    """``"2048,4096"`` -> ``(2048, 4096)``, sorted and deduplicated; each must be >= 256 (the
    stock items reserve 128 tokens for the answer)."""
    parts = text.split(",") if isinstance(text, str) else list(text)
    out = set()
    for p in parts:
        if isinstance(p, str) and not p.strip():
            continue
        try:
            n = int(p)
        except (TypeError, ValueError):
            raise ValueError(f"--context-lengths must be integers, got {p!r}") from None
        if n < 256:
            raise ValueError(f"context length {n} is too short for RULER (>= 256)")
        out.add(n)
    if not out:
        raise ValueError("no context lengths given")
    return tuple(sorted(out))


def lengths_for(subtask: str, lengths: Sequence[int]) -> tuple[int, ...]:
    """The requested lengths that ``subtask`` can fill (see ``RulerSubtask.min_length``)."""
    return tuple(n for n in lengths if n >= RULER_SUBTASKS[subtask].min_length)


def plan(subtasks: Sequence[str], lengths: Sequence[int],
         warn: bool = False) -> dict[str, tuple[int, ...]]:
    """Subtask -> the lengths it runs at; subtasks that fit none are left out (logged with
    ``warn``), and a ``ValueError`` when nothing is left."""
    out = {s: lengths_for(s, lengths) for s in subtasks}
    for s, ls in out.items():
        if not ls and warn:
            log.warning("RULER %s needs context lengths >= %d; skipped at %s", s,
                        RULER_SUBTASKS[s].min_length, ",".join(map(str, lengths)))
    out = {s: ls for s, ls in out.items() if ls}
    if not out:
        need = min(RULER_SUBTASKS[s].min_length for s in subtasks)
        raise ValueError(f"no RULER subtask of {','.join(subtasks)} fits context lengths "
                         f"{','.join(map(str, lengths))} (the shortest needs {need})")
    return out


def tokenizer_source(model: str) -> str:
    """What RULER's ``AutoTokenizer.from_pretrained`` should read for ``model``: the bundled
    fixture's folder, or the hub id / local folder itself."""
    from ..models.fixture import FIXTURES, fixture_path

    if model in FIXTURES:
        return str(fixture_path(model))
    if model.startswith("random:"):
        raise ValueError(f"RULER sizes its items with the model's tokenizer; {model!r} has no "
                         "tokenizer folder (use a fixture, hub id or local folder)")
    return model


def model_context_limit(model: str) -> int | None:
    """The model's ``max_position_embeddings`` (None when its config cannot be read here)."""
    try:
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(tokenizer_source(model))
    except (OSError, ValueError, KeyError):
        return None
    cfg = getattr(cfg, "text_config", None) or cfg
    limit = getattr(cfg, "max_position_embeddings", None)
    return int(limit) if limit else None


def check_context_lengths(model: str, lengths: Sequence[int]) -> None:
    """A ``ValueError`` when a length exceeds what the model takes."""
    limit = model_context_limit(model)
    too_long = [n for n in lengths if limit is not None and n > limit]
    if too_long:
        raise ValueError(f"context length {max(too_long)} exceeds {model}'s limit of {limit} "
                         "tokens (max_position_embeddings)")


def num_samples_for(limit: int | float | None) -> int:
    """Items per (subtask, length) from ``--limit``: a count, a fraction of the stock 500, or
    the stock 500."""
    if limit is None:
        return STOCK_NUM_SAMPLES
    if limit < 1:
        return max(1, math.ceil(limit * STOCK_NUM_SAMPLES))
    return int(limit)


# ----------------------------------------------------------------------------- stock modules
@contextlib.contextmanager
def _no_punkt_download() -> Iterator[None]:
    """Turn RULER's import-time ``nltk.download("punkt_tab")`` into a no-op when the data is
    not installed (and silence its console lines): the synthetic subtasks never split
    sentences, and offline the download only prints errors."""
    import nltk

    try:
        nltk.data.find("tokenizers/punkt_tab")
        yield
        return
    except LookupError:
        pass
    download = nltk.download
    nltk.download = lambda *a, **k: False
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        nltk.download = download


def import_stock_modules(subtasks: Sequence[str] = DEFAULT_SUBTASKS) -> None:
    """Import RULER's generator modules (``prepare_niah`` builds its ~6M-entry key word list
    at import, several seconds). With only synthetic subtasks the punkt download is skipped."""
    need_hub = any(not RULER_SUBTASKS[s].offline for s in subtasks)
    guard = contextlib.nullcontext() if need_hub else _no_punkt_download()
    try:
        with guard:
            importlib.import_module("lm_eval.tasks.ruler.prepare_niah")
    except ImportError as e:
        raise ValueError(f"RULER needs nltk and wonderwords ({e}); pip install "
                         "'replayssm-quant[eval]'") from None


def _seed(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:4], "big")


def ruler_docs(subtask: str, tokenizer: str, length: int, num_samples: int,
               seed: int = 0) -> list[dict[str, Any]]:
    """``num_samples`` items of ``subtask`` at ``length`` tokens, built by the stock generator
    with the stock settings; the same arguments give the same items in any process."""
    import numpy as np

    spec = RULER_SUBTASKS[subtask]
    import_stock_modules([subtask])
    module = importlib.import_module(f"lm_eval.tasks.ruler.{spec.module}")
    sampler = getattr(module, spec.sampler)

    def sized(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("num_samples") == STOCK_NUM_SAMPLES:
            kwargs["num_samples"] = num_samples
        return sampler(*args, **kwargs)

    state, np_state = random.getstate(), np.random.get_state()
    random.seed(_seed("ruler", subtask, length, seed))
    np.random.seed(_seed("ruler-np", subtask, length, seed))
    setattr(module, spec.sampler, sized)
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # vt prints its length search
            out = getattr(module, spec.function)(max_seq_lengths=[int(length)],
                                                 tokenizer=tokenizer)
    finally:
        setattr(module, spec.sampler, sampler)
        random.setstate(state)
        np.random.set_state(np_state)
    return list(out["test"])


def dataset(**kwargs: Any) -> dict[str, Any]:
    """``custom_dataset`` of the wrappers: the items of ``metadata.subtask`` at every length of
    ``metadata.max_seq_lengths``, ``num_samples`` each (see :func:`ruler_docs`)."""
    import datasets

    rows: list[dict[str, Any]] = []
    for length in kwargs["max_seq_lengths"]:
        rows += ruler_docs(kwargs["subtask"], kwargs["tokenizer"], int(length),
                           int(kwargs["num_samples"]), int(kwargs.get("seed", 0)))
    return {"test": datasets.Dataset.from_list(rows, split=datasets.Split.TEST)}


# ----------------------------------------------------------------------------- wrappers
class _Function(str):
    """A ``!function`` reference in a written YAML."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Function, lambda d, v: d.represent_scalar("!function", str(v)))

_AGGREGATE = _Function("lm_eval.tasks.ruler.common_utils.aggregate_metrics")
_STOCK_LENGTHS = (4096, 8192, 16384, 32768, 65536, 131072)


def _metric_list(lengths: Sequence[int]) -> list[dict[str, Any]]:
    return [{"metric": str(n), "aggregation": _AGGREGATE, "higher_is_better": True}
            for n in sorted(set(_STOCK_LENGTHS) | set(lengths))]


def _dump(path: Path, cfg: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(yaml.dump(cfg, Dumper=_Dumper, sort_keys=False))
    os.replace(tmp, path)


def wrapper_name(subtask: str) -> str:
    return RULER_SUBTASKS[subtask].task + WRAPPER_SUFFIX


def write_ruler_tasks(out_dir: str | Path, subtasks: Sequence[str], lengths: Sequence[int],
                      tokenizer: str, num_samples: int, seed: int = 0) -> tuple[str, list[str]]:
    """Write one wrapper per subtask (at the lengths it can fill, :func:`plan`) and a group over
    them into ``out_dir``; returns ``(group name, wrapper names)``."""
    from .tasks import stock_task_dir

    out_dir = Path(out_dir)
    stock = stock_task_dir() / "ruler"
    names = []
    for key, own in plan(subtasks, lengths, warn=True).items():
        spec = RULER_SUBTASKS[key]
        name = wrapper_name(key)
        _dump(out_dir / f"{name}.yaml", {
            "include": str(stock / spec.yaml), "task": name,
            "custom_dataset": _Function(f"{__name__}.dataset"),
            "metric_list": _metric_list(lengths),
            "metadata": {"version": 1.0, "subtask": key, "max_seq_lengths": list(own),
                         "tokenizer": tokenizer, "num_samples": int(num_samples),
                         "seed": int(seed)}})
        names.append(name)
    _dump(out_dir / f"{GROUP_NAME}.yaml", {
        "group": GROUP_NAME, "task": names,
        "aggregate_metric_list": [{"metric": str(n), "weight_by_size": False}
                                  for n in lengths],
        "metadata": {"version": 1}})
    return GROUP_NAME, names


# ----------------------------------------------------------------------------- results
def subtask_key(task_name: str) -> str:
    """``niah_single_1_local`` / ``ruler_vt_local`` -> ``niah_single_1`` / ``vt``."""
    base = task_name.removesuffix(WRAPPER_SUFFIX)
    for key, spec in RULER_SUBTASKS.items():
        if spec.task == base:
            return key
    return base


def split_by_length(results: dict[str, Any]) -> dict[str, Any]:
    """lm-eval's results with the logged samples regrouped per (subtask, length) as
    ``<subtask>@<length>`` (the paired statistics key items by (subtask, doc_id)) and each
    sample's score at its own length copied to ``score`` (the stock metric is named after
    the length). ``doc_id`` becomes the generator's index within its length: lm-eval counts
    through every length of a subtask, so its ids at the second length would shift with the
    item count and runs of different ``--limit`` would not pair."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for task_name, samples in (results.get("samples") or {}).items():
        key = subtask_key(task_name)
        for s in samples:
            length = int(s["doc"]["max_length"])
            own = {"score": s[str(length)], "doc_id": int(s["doc"].get("index", s["doc_id"]))}
            grouped.setdefault(f"{key}@{length}", []).append(s | own)
    return results | {"samples": grouped}


def rescore_items(items: Any) -> Any:
    """RULER's items are right when every expected string is in the answer window: the stock
    generation has no stop sequence and reads a fixed number of tokens, so reaching
    ``max_gen_toks`` is how every answer ends, not a cut-off answer."""
    if len(items):
        items = items.copy()
        items["correct"] = items["score_raw"] >= 1.0
    return items
