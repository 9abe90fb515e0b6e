"""Running one unit of a sweep in this process: a call of the library functions behind
``replayssm-quant drift`` and ``eval``, writing the files those commands write.

Units of one result folder run side by side, so they write only their own files (pair files,
``runs/<task>/<config>/``), each to a temporary name renamed into place with any completion
marker last; the folder's aggregate files (``summary.json`` ...) are written once, by its
summary unit, through the same functions the single commands use. A unit whose files are
already there finds them and computes nothing, which is how a rerun resumes.
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable
from typing import Any

from .plan import Plan, Unit

__all__ = ["RESPONDER_ENV", "run_unit", "suite_settings"]

RESPONDER_ENV = "REPLAYSSM_SWEEP_RESPONDER"
"""``module:function`` of a factory ``(model, task, config) -> responder`` whose responder answers
eval prompts instead of the model (tests, dry runs of a plan); read by the driver."""

_LOADED: dict[str, Any] = {}
"""The last model this worker process loaded (``key``, ``model``, ``tokenizer``, ``suite``):
consecutive units of one model skip the load."""


def run_unit(unit: Unit, plan: Plan, responder: str | None = None) -> dict[str, Any]:
    """Run ``unit`` of ``plan``; returns ``{"id", "ran", "seconds"}`` (``ran``: whether it
    computed anything, rather than finding its files done)."""
    t0 = time.perf_counter()
    _quiet()
    ran = {"drift": _drift, "drift-summary": _drift_summary, "eval": _eval,
           "eval-summary": _eval_summary}[unit.kind](unit, plan, responder)
    return {"id": unit.id, "ran": ran, "seconds": time.perf_counter() - t0}


# ----------------------------------------------------------------------------------- drift
def _drift_kwargs(plan: Plan) -> dict[str, Any]:
    d = plan.drift
    assert d is not None
    return dict(data=d.data, max_tokens=d.max_tokens, docs=d.docs, prefill=d.prefill,
                seed=d.seed, reference=d.reference)


def _drift(unit: Unit, plan: Plan, responder: str | None) -> bool:
    from ..evals.drift import run_drift

    model, tok = _model(unit.model, plan)
    kw = _drift_kwargs(plan)
    result = run_drift(model, [unit.config], kw.pop("data"), tokenizer=tok, **kw,
                       out=unit.folder, model_name=unit.model, keep_reference=True,
                       select=unit.docs, pairs_only=True)
    return bool(result.files)


def _drift_summary(unit: Unit, plan: Plan, responder: str | None) -> bool:
    from ..evals.drift import run_drift

    assert plan.drift is not None
    model, tok = _model(unit.model, plan)
    kw = _drift_kwargs(plan)
    run_drift(model, list(plan.drift.configs), kw.pop("data"), tokenizer=tok, **kw,
              out=unit.folder, model_name=unit.model,
              keep_reference=plan.drift.keep_reference)
    return True


def _model(name: str, plan: Plan) -> tuple[Any, Any]:
    import torch

    from ..models.loading import load_model

    device, dtype = _device_dtype(plan)
    key = f"{name}|{device}|{dtype}"
    if _LOADED.get("key") != key:
        _LOADED.clear()
        model, tok = load_model(name, device=device, dtype=dtype)
        _LOADED.update(key=key, model=model, tokenizer=tok)
    if not device.startswith("cuda"):
        torch.set_num_threads(plan.threads)
    return _LOADED["model"], _LOADED["tokenizer"]


def _device_dtype(plan: Plan) -> tuple[str, Any]:
    """As ``drift`` resolves ``--device auto`` / ``--dtype auto``: Ray shows a unit only the
    GPUs it asked for, so a unit with no GPU runs on the CPU."""
    import torch

    device = plan.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if plan.dtype == "auto":
        return device, torch.bfloat16 if device.startswith("cuda") else torch.float32
    return device, getattr(torch, {"fp32": "float32", "bf16": "bfloat16",
                                   "fp16": "float16"}.get(plan.dtype, plan.dtype))


# ----------------------------------------------------------------------------------- eval
def suite_settings(plan: Plan, model: str, tasks: tuple[str, ...],
                   configs: tuple[str, ...]) -> Any:
    """The :class:`~replayssm_quant.evals.suite.SuiteSettings` ``eval`` builds from the same
    options."""
    from ..evals.suite import SuiteSettings

    e = plan.eval
    assert e is not None
    device = plan.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return SuiteSettings(
        model=model, tasks=tasks, configs=configs, limit=e.limit, max_gen_toks=e.max_gen_toks,
        seed=e.seed, data=e.data, backend=e.backend, dtype=e.dtype, device=device,
        batch_size=e.batch_size, context_lengths=e.context_lengths,
        ruler_subtasks=e.ruler_subtasks, carry_terms=e.carry_terms, carry_rule=e.carry_rule,
        tensor_parallel_size=e.tensor_parallel_size, data_parallel_size=e.data_parallel_size)


def _eval(unit: Unit, plan: Plan, responder: str | None) -> bool:
    import torch

    from ..evals.suite import run_suite

    assert plan.eval is not None and unit.task is not None and unit.config is not None
    if plan.eval.data is not None:
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    settings = suite_settings(plan, unit.model, (unit.task,), (unit.config,))
    if not settings.device.startswith("cuda"):
        torch.set_num_threads(plan.threads)
    key = f"suite|{unit.model}|{settings.device}|{settings.dtype}"
    if _LOADED.get("key") != key:
        _LOADED.clear()
        _LOADED.update(key=key, suite={})
    answer = _responder(responder, unit) if responder else None
    result = run_suite(settings, unit.folder, responder=answer, summary=False,
                       cache=_LOADED["suite"])
    return bool(result.ran)


def _eval_summary(unit: Unit, plan: Plan, responder: str | None) -> bool:
    from ..evals.suite import write_summary

    e = plan.eval
    assert e is not None
    write_summary(unit.folder, suite_settings(plan, unit.model, e.tasks, e.configs),
                  resamples=e.resamples)
    return True


def _responder(spec: str, unit: Unit) -> Callable[[str, dict], str | None]:
    module, _, name = spec.partition(":")
    factory = getattr(importlib.import_module(module), name)
    return factory(unit.model, unit.task, unit.config)


def _quiet() -> None:
    """The single commands' quiet settings: workers' logs are not the sweep's output."""
    import logging

    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    try:
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
    except ImportError:
        pass
    try:
        import datasets

        datasets.disable_progress_bars()
    except ImportError:
        pass
