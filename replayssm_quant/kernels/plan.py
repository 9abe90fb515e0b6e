"""What a decode step launches, resolved in one place.

Every knob of ``mamba2_decode_step`` / ``gdn_decode_step`` has a default that depends on the
config, the layer's shape, the batch size and the GPU (tile rows, warps, one launch or three,
the flush's fold, products, pipelining stages, TMA, programmatic launch). The decode steps
resolve them through ``mamba2_step_plan`` / ``gdn_step_plan`` and launch exactly what the
returned ``StepPlan`` says, so the plan printed for a config (``step_plan``, the
``replayssm-quant plan`` command) is the plan the GPU runs. A plan also validates the knobs
before any launch: a bad one fails with the reason and nothing runs.

``log_plans()`` (or ``REPLAYSSM_QUANT_LOG_PLANS=1`` in the environment) logs the plan of every
distinct step the kernels launch, once each, so a server (the vLLM plugin) shows what its
layers run at each batch size it captures.
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
from dataclasses import asdict, dataclass
from typing import Any

import torch

from .core.target import TARGETS, Target, resolve_target

__all__ = ["TARGETS", "FlushPlan", "StepPlan", "Target", "check_knob_names", "log_plans", "note_plan",
           "resolve_target", "step_plan"]

LOG_PLANS_ENV = "REPLAYSSM_QUANT_LOG_PLANS"


logger = logging.getLogger(__name__)


_log = {"on": os.environ.get(LOG_PLANS_ENV, "").strip() not in ("", "0")}


_logged: set[tuple] = set()


@dataclass(frozen=True)
class FlushPlan:
    """The persistent flush launch of a ReplaySSM step: ``tiles`` tiles of ``rows`` state
    rows walked by resident programs of ``warps`` warps (``per_sm`` each SM when set, else as
    many as the compiled kernel leaves resident)."""

    fold: str  # "dot" (the window as one product) or "records" (rank-1 updates)
    rows: int
    warps: int
    precision: str  # input precision of the fold's products
    stages: int | None  # software-pipelining stages; None: Triton's choice
    tma: bool  # checkpoint tiles moved by the tensor memory accelerator
    tiles: int
    per_sm: int | None
    maxnreg: int | None
    pdl: bool  # launched as a programmatic dependent of the non-flush launch
    advances_cursor: bool  # the flush launch also moves every row's cursor on
    recompute_u: bool = False  # GDN: the window's u's recomputed from the checkpoint
    ut: bool = False  # GDN: ... through the UT transform the ring-products launch builds

    def programs(self, target: Target) -> str:
        """The grid as far as it is known without compiling: exact with ``per_sm``."""
        if not target.cuda:
            return str(max(1, min(self.tiles, 4)))
        if self.per_sm:
            return str(max(1, min(self.tiles, self.per_sm * target.sms)))
        return f"resident/SM x {target.sms}"


@dataclass(frozen=True)
class StepPlan:
    """Every launch of one decode step and the knobs it runs with (see the module doc)."""

    kind: str  # "mamba2" or "gdn"
    config: str
    batch: int
    heads: int  # (value) heads
    dim: int  # state rows per head (Mamba-2 head_dim, GDN d_v)
    d_state: int  # state columns (Mamba-2 d_state, GDN d_k)
    groups: int  # Mamba-2 groups, GDN key heads
    capacity: int  # ring capacity (0: conventional decoding)
    target: Target
    one_launch: bool  # flushing rows flush on the step's own tiles, no other launch
    ticket: bool  # each row's last program advances its cursor (one-launch steps)
    separate_advance: bool  # a launch of its own advances the cursors
    rows: int  # state rows per step program
    rows2: int  # second row pass of a whole-head program (0: none)
    tiles: int  # step programs per head
    tile_first: bool  # grid order (tiles, heads, rows) instead of (rows, heads, tiles)
    grid: tuple[int, int, int]
    warps: int
    maxnreg: int | None
    fused_prep: bool  # the step programs form the ring products themselves
    prep_groups: int | None  # groups / key heads per ring-products program (its own launch)
    prep_grid: tuple[int, ...] | None
    step_pdl: bool  # the step launch is a programmatic dependent of the ring products
    flush: FlushPlan | None
    prep_pdl: bool = False  # the ring products release the step launch at once
    decode: str = ""  # how a narrow source is decoded (NVFP4 "e4m3" / "words" / "lut", fp8 "words8")
    early_loads: bool = False
    lut: bool = False  # an NVFP4 source decoded through a 16-entry table
    step_flush_rows: int = 0  # rows per flush pass of a one-launch program (0: its rows at once)
    step_flush_fold: str = "records"  # how such a pass folds its records ("records" / "dot")

    @property
    def conventional(self) -> bool:
        return self.capacity == 0

    def launches(self) -> list[dict[str, Any]]:
        """One dict per launch, in launch order: name, kernel, grid, tile and knobs."""
        pre = "_mamba2" if self.kind == "mamba2" else "_gdn"
        out: list[dict[str, Any]] = []
        tile = (f"{self.rows}+{self.rows2}" if self.rows2 else str(self.rows)) + f" x {self.d_state}"
        common = {"warps": self.warps, "maxnreg": self.maxnreg}
        if self.conventional:
            out.append({"launch": "conventional step", "kernel": f"{pre}_conv_kernel",
                        "grid": self.grid, "programs": _prod(self.grid), "tile": tile,
                        **common, "knobs": {"tile_first": self.tile_first,
                                            "advances_cursor": self.ticket}})
        else:
            if self.prep_grid is not None:
                unit = "group(s)" if self.kind == "mamba2" else "key head(s)"
                out.append({"launch": "ring products + flush list", "kernel": f"{pre}_prep_kernel",
                            "grid": self.prep_grid, "programs": _prod(self.prep_grid),
                            "tile": f"{self.prep_groups} {unit}", "warps": 4, "maxnreg": None,
                            "knobs": {"ut_transform": bool(self.flush and self.flush.ut),
                                      "pdl": self.prep_pdl}})
            knobs: dict[str, Any] = {"tile_first": self.tile_first, "fused_prep": self.fused_prep,
                                     "one_launch": self.one_launch, "pdl": self.step_pdl}
            if self.decode == "words8":
                knobs["fp8_decode"] = "words"
            elif self.decode:
                knobs["nvfp4_decode"] = self.decode
            if self.early_loads:
                knobs["early_loads"] = True
            if self.one_launch:
                knobs["flush"] = ("on the step's tiles, records one by one"
                                  if self.step_flush_fold == "records" else
                                  "on the step's tiles, records as one bf16x3 product")
                if self.step_flush_rows:
                    knobs["flush"] += f", {self.step_flush_rows} rows a pass"
            out.append({"launch": "non-flush step" + (" + flush" if self.one_launch else ""),
                        "kernel": f"{pre}_nonflush_kernel", "grid": self.grid,
                        "programs": _prod(self.grid), "tile": tile, **common, "knobs": knobs})
            if self.flush is not None:
                f = self.flush
                fk: dict[str, Any] = {"tiles": f.tiles, "fold": f.fold, "precision": f.precision,
                                      "stages": f.stages if f.stages is not None else "triton",
                                      "tma": f.tma, "pdl": f.pdl,
                                      "advances_cursor": f.advances_cursor}
                if f.recompute_u:
                    fk["u"] = "UT transform" if f.ut else "replayed from the checkpoint"
                out.append({"launch": "flush (persistent)", "kernel": f"{pre}_flush_kernel",
                            "grid": (f.programs(self.target),), "programs": f.programs(self.target),
                            "tile": f"{f.rows} x {self.d_state}",
                            "warps": f.warps, "maxnreg": f.maxnreg, "knobs": fk})
        if self.separate_advance:
            out.append({"launch": "cursor advance", "kernel": "_advance_kernel",
                        "grid": (-(-self.batch // 256),), "programs": -(-self.batch // 256),
                        "tile": "256 rows", "warps": 4, "maxnreg": None, "knobs": {}})
        return out

    def summary(self) -> str:
        """The launches on one line, for benchmark tables: ``name programs tile warps`` per
        launch and the flush's fold / products / stages / TMA, e.g. ``prep 2048 | nonflush
        32768x(64x128) w1 | flush (16x128) w1 dot bf16x3 s2 tma``."""
        parts = []
        for ln in self.launches():
            name = {"ring products + flush list": "prep", "non-flush step": "nonflush",
                    "non-flush step + flush": "nonflush+flush", "flush (persistent)": "flush",
                    "conventional step": "conv", "cursor advance": "advance"}[ln["launch"]]
            if name in ("prep", "advance"):
                parts.append(f"{name} {ln['programs']}")
            elif name == "flush":
                k = ln["knobs"]
                parts.append(f"flush ({ln['tile'].replace(' ', '')}) w{ln['warps']} {k['fold']} "
                             f"{k['precision']} s{k['stages'] if k['stages'] != 'triton' else '-'}"
                             + (" tma" if k["tma"] else "") + (" pdl" if k["pdl"] else ""))
            else:
                parts.append(f"{name} {ln['programs']}x({ln['tile'].replace(' ', '')}) w{ln['warps']}"
                             + (" pdl" if ln["knobs"].get("pdl") else "")
                             + (f" passes {self.step_flush_rows} {self.step_flush_fold}"
                                if name == "nonflush+flush" and self.step_flush_rows else ""))
        return " | ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["target"] = asdict(self.target)
        d["launches"] = self.launches()
        return d


def log_plans(enabled: bool = True) -> None:
    """Log (INFO, logger ``replayssm_quant.kernels.plan``) the plan of every distinct decode
    step launched from now on, once per (layer shape, config, batch, plan); with no handler
    configured anywhere a stderr handler is added, so the lines show without a logging setup.
    Off by default (each step then pays one flag check)."""
    _log["on"] = enabled
    if enabled:
        logger.setLevel(logging.INFO)
        if not logger.hasHandlers():
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
            logger.addHandler(handler)


def note_plan(plan: StepPlan) -> None:
    """Log ``plan`` if plans are logged (``log_plans``) and this one was not logged yet."""
    if not _log["on"]:
        return
    summary = plan.summary()
    key = (plan.kind, plan.config, plan.batch, plan.heads, plan.dim, plan.d_state, plan.groups,
           plan.capacity, plan.target.name, summary)
    if key in _logged:
        return
    _logged.add(key)
    logger.info("%s step, %d heads x %d x %d (%d %s), %s, batch %d on %s: %s", plan.kind,
                plan.heads, plan.dim, plan.d_state, plan.groups,
                "groups" if plan.kind == "mamba2" else "key heads", plan.config, plan.batch,
                plan.target.name, summary)


def check_knob_names(plan_fn, knobs: dict[str, Any]) -> None:
    """Refuse knob names ``plan_fn`` does not take, also where a step runs the reference and
    never resolves a plan (a misspelt knob must not pass silently on a CPU)."""
    unknown = sorted(set(knobs) - set(inspect.signature(plan_fn).parameters))
    if unknown:
        raise TypeError(f"unknown launch knob(s) {', '.join(unknown)} "
                        f"(the keyword arguments of {plan_fn.__name__})")


def _prod(grid: tuple[int, ...]) -> int:
    n = 1
    for g in grid:
        n *= g
    return n


def step_plan(shape, cfg, batch: int, target: Target | str | torch.device = "h200", *,
              act_dtype: torch.dtype = torch.bfloat16, spec_tokens: int = 0,
              **knobs: Any) -> StepPlan:
    """The plan of one decode step of layer ``shape`` (a ``precision.ModelShape`` or its
    name) under ``cfg`` (a ``PrecisionConfig`` or config string / preset) at ``batch`` rows
    on ``target`` (a ``Target``, its name for ``resolve_target`` or a torch device), with the
    decode step's
    keyword knobs (``block_p`` / ``block_v``, ``flush_warps``, ``one_launch``, ...); ring
    activations in ``act_dtype`` as vLLM stores them."""
    from ..precision import parse_config, resolve_shape

    if isinstance(shape, str):
        shape = resolve_shape(shape)
    if isinstance(cfg, str):
        cfg = parse_config(cfg)
    target = resolve_target(target) if isinstance(target, str) else Target.of(target)
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    capacity = cfg.L + spec_tokens if cfg.L > 1 or spec_tokens else 0
    if shape.kind == "mamba2":
        from .mamba2 import mamba2_step_plan

        return mamba2_step_plan(cfg, capacity, shape.heads, shape.head_dim, shape.d_state,
                                shape.groups, batch, target, ring_dtype=act_dtype, **knobs)
    from .gdn import gdn_step_plan

    return gdn_step_plan(cfg, capacity, shape.heads, shape.groups, shape.head_dim, shape.d_state,
                         batch, target, ring_dtype=act_dtype, **knobs)
