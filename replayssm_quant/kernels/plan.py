"""What a decode step launches, resolved in one place.

Every knob of ``mamba2_decode_step`` / ``gdn_decode_step`` has a default that depends on the
config, the layer's shape, the batch size and the GPU (tile rows, warps, one launch or three,
the flush's fold, products, pipelining stages, TMA, programmatic launch). The decode steps
gather their keyword knobs once (``knobs.StepKnobs.of``: ``Mamba2Knobs`` / ``GdnKnobs``),
resolve them through ``mamba2_step_plan`` / ``gdn_step_plan`` and launch exactly what the
returned ``StepPlan`` says, so the plan printed for a config (``step_plan``, the
``replayssm-quant plan`` command) is the plan the GPU runs. A plan also validates the knobs
before any launch: a bad one fails with the reason and nothing runs.

``log_plans()`` (or ``REPLAYSSM_QUANT_LOG_PLANS=1`` in the environment) logs the plan of every
distinct step the kernels launch, once each, so a server (the vLLM plugin) shows what its
layers run at each batch size it captures.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import asdict, dataclass
from typing import Any

import torch
import triton

from .core.memory import resolve_flush_tma, step_grid
from .core.target import TARGETS, Target, resolve_target
from .knobs import (
    DEFAULT,
    GdnKnobs,
    Mamba2Knobs,
    StepKnobs,
    check_prep_groups,
    check_step_flush,
    check_ut_tile,
    fold_precision,
    fp8_decode_of,
    gdn_nvfp4_decode_of,
    nvfp4_decode_of,
    pdl_edges_of,
    records_fold,
    resolve_pdl,
)
from .tuning import Table, table_for
from .tuning.gdn_rules import (
    gdn_flush_knobs,
    gdn_flush_maxnreg_default,
    gdn_flush_stages,
    gdn_fp8_decode_default,
    gdn_nonflush_maxnreg_default,
    gdn_prep_groups_default,
    gdn_step_knobs,
    gdn_tile_first,
)
from .tuning.mamba2_rules import (
    early_loads_default,
    flush_passes_default,
    flush_stages_for,
    mamba2_flush_knobs,
    mamba2_flush_maxnreg_default,
    mamba2_nonflush_maxnreg_default,
    mamba2_step_knobs,
    mamba2_tile_first,
    step_flush_default,
    whole_head_default,
    whole_head_rows,
)
from .tuning.rules import (
    default_fold_precision,
    fused_prep_default,
    keeps_counters,
    prep_groups_default,
    reads_narrow_copy,
    resolve_one_launch,
    small_grid_rows,
)

LOG_PLANS_ENV = "REPLAYSSM_QUANT_LOG_PLANS"

MAMBA2_DEFAULTS = Mamba2Knobs()
GDN_DEFAULTS = GdnKnobs()

__all__ = ["TARGETS", "FlushPlan", "GdnKnobs", "Mamba2Knobs", "StepKnobs", "StepPlan", "Target",
           "gdn_step_plan", "log_plans", "mamba2_step_plan", "note_plan", "resolve_target",
           "step_plan"]


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


def _prod(grid: tuple[int, ...]) -> int:
    n = 1
    for g in grid:
        n *= g
    return n


def step_plan(shape, cfg, batch: int, target: Target | str | torch.device = "h200", *,
              act_dtype: torch.dtype = torch.bfloat16, spec_tokens: int = 0,
              ckpt_data: torch.Tensor | None = None, **knobs: Any) -> StepPlan:
    """The plan of one decode step of layer ``shape`` (a ``precision.ModelShape`` or its
    name) under ``cfg`` (a ``PrecisionConfig`` or config string / preset) at ``batch`` rows
    on ``target`` (a ``Target``, its name for ``resolve_target`` or a torch device), with the
    decode step's keyword knobs (``block_p`` / ``block_v``, ``flush_warps``, ``one_launch``,
    ...: the fields of ``knobs.Mamba2Knobs`` / ``knobs.GdnKnobs``); ring activations in
    ``act_dtype`` as vLLM stores them; ``ckpt_data`` as the planners take it."""
    from ..precision import parse_config, resolve_shape

    if isinstance(shape, str):
        shape = resolve_shape(shape)
    if isinstance(cfg, str):
        cfg = parse_config(cfg)
    target = resolve_target(target) if isinstance(target, str) else Target.of(target)
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    capacity = cfg.L + spec_tokens if cfg.L > 1 or spec_tokens else 0
    step_knobs = StepKnobs.of(shape.kind, **knobs)
    if shape.kind == "mamba2":
        return mamba2_step_plan(cfg, capacity, shape.heads, shape.head_dim, shape.d_state,
                                shape.groups, batch, target, step_knobs, ring_dtype=act_dtype,
                                ckpt_data=ckpt_data)
    return gdn_step_plan(cfg, capacity, shape.heads, shape.groups, shape.head_dim, shape.d_state,
                         batch, target, step_knobs, ring_dtype=act_dtype, ckpt_data=ckpt_data)


def _target_table(target: object, knobs: StepKnobs, groups: int, what: str) -> tuple[Target, Table]:
    """A planner's first steps, the same for both ops: the target, its GPU family's table, and
    the check of ``prep_groups`` against the layer's ``groups`` (named ``what``)."""
    target = Target.of(target)
    table = table_for(target)
    check_prep_groups(knobs.prep_groups, groups, what)
    return target, table


def mamba2_step_plan(cfg, capacity: int, H: int, P: int, N: int, G: int, batch: int,
                     target: Target | torch.device, knobs: Mamba2Knobs = MAMBA2_DEFAULTS, *,
                     ring_dtype: torch.dtype = torch.bfloat16,
                     ckpt_data: torch.Tensor | None = None) -> StepPlan:
    """The launches of ``mamba2_decode_step`` for H heads of P rows x N state columns in G
    groups, ring capacity ``capacity`` (0: conventional), ``batch`` rows on ``target``, with
    its ``knobs``; every knob that needs the layer, batch or GPU is checked here, before any
    launch. ``ring_dtype`` (B's) picks the flush's default products, ``ckpt_data`` lets the
    flush check that TMA can address the checkpoint (``plan.step_plan`` prints one)."""
    k = knobs
    target, table = _target_table(target, k, G, "groups")
    fmaxnreg = k.given_flush_maxnreg
    src = cfg.read or cfg.ckpt
    mode = nvfp4_decode_of(k.nvfp4_decode, table["mamba2.nvfp4_decode"].value)
    decode = (("lut" if k.lut else mode) if src.name == "nvfp4" else
              fp8_decode_of(k.fp8_decode, src.name, capacity, table["mamba2.fp8_decode"].value))
    kb, kw = mamba2_step_knobs(cfg, P, N, table=table)
    split = whole_head_rows(P, N, table=table) if capacity else None
    step_flush_rows, step_flush_fold = k.step_flush_rows, k.step_flush_fold

    def step_rows(ol: bool) -> tuple[int, int]:
        """(rows, second row pass) of a step program, one launch or not."""
        rows = k.block_p or small_grid_rows(cfg, kb, P, H, batch, ol, table=table)
        wh = k.whole_head
        if wh is None:
            passes = flush_passes_default(cfg, P, table=table) or step_flush_rows is not None
            wh = (whole_head_default(cfg, ol, passes, table=table) and k.block_p is None
                  and rows == kb)
        return split if wh and split is not None else (rows, 0)

    # one launch up to a larger batch where its programs would flush in row passes
    passes = (capacity > 0 and step_flush_rows is None and step_flush_fold is None
              and flush_passes_default(cfg, P, table=table)
              and step_flush_default(cfg, *step_rows(True), ring_dtype, table=table)[0] is not None)
    ol = resolve_one_launch(k.one_launch, batch, k.persistent_flush_knobs(),
                            conventional=capacity == 0, step_state=batch * H * P * N,
                            passes=passes, table=table)
    advance = k.advance and keeps_counters(cfg, capacity, table=table)
    ticket = ol and advance and k.fuse_advance  # each row's last program advances its cursor
    use_pdl, pdl_edges = resolve_pdl(k.pdl, target, table=table), pdl_edges_of(k.pdl)
    early_loads = k.early_loads
    if early_loads is None:
        early_loads = early_loads_default(cfg, batch, ol, table=table)
    BP, BP2 = step_rows(ol)
    tiles = 1 if BP2 else triton.cdiv(P, BP)
    tile_first = k.tile_first
    if tile_first is None:
        tile_first = (not reads_narrow_copy(cfg) if BP2 else
                      mamba2_tile_first(capacity, P, BP, reads_narrow_copy(cfg), table=table))
    base = dict(kind="mamba2", config=str(cfg), batch=batch, heads=H, dim=P, d_state=N,
                groups=G, capacity=capacity, target=target, one_launch=ol, ticket=ticket,
                rows=BP, rows2=BP2, tiles=tiles, tile_first=bool(tile_first),
                grid=step_grid(batch, H, tiles, tile_first), warps=k.num_warps or kw,
                maxnreg=k.step_maxnreg, decode=decode, early_loads=bool(early_loads),
                lut=bool(k.lut))
    if capacity == 0:
        return StepPlan(**{**base, "decode": "", "early_loads": False},
                        separate_advance=advance and not ticket, fused_prep=False,
                        prep_groups=None, prep_grid=None, step_pdl=False, flush=None)
    if ol and step_flush_rows is None and step_flush_fold is None:
        step_flush_rows, step_flush_fold = step_flush_default(cfg, BP, BP2, ring_dtype, table=table)
    fr, fr_fold = check_step_flush(step_flush_rows, step_flush_fold, ol, BP, BP2, ring_dtype)
    # a one-launch step forms its ring products unless asked not to (then the products launch
    # runs before it, and the step is two launches)
    fuse_prep = k.fuse_prep
    fp = ((fuse_prep is None or fuse_prep) if ol else
          (fused_prep_default(batch, table=table) if fuse_prep is None else fuse_prep))
    if decode == "mma" and (fp or ol):
        raise ValueError("nvfp4_decode='mma' reads the fp16 pieces of C that the ring-products "
                         "launch writes: it needs a step with that launch (fuse_prep=False and "
                         "one_launch=False, the defaults from batch 5)")
    if k.maxnreg is DEFAULT:
        base["maxnreg"] = mamba2_nonflush_maxnreg_default(decode, BP2, base["warps"], kw, fp,
                                                          batch, table=table)
    pg = None if fp else k.prep_groups or prep_groups_default(batch, G, table=table)
    # programmatic launches: the non-flush launch after the ring products, the flush after it
    prep_pdl = use_pdl and "prep" in pdl_edges
    step_pdl = use_pdl and not fp and "prep" in pdl_edges
    flush = None
    if not ol:
        fold, fblock, fwarps = mamba2_flush_knobs(cfg, table=table)
        BPF = min(k.flush_block_p or fblock, triton.next_power_of_2(P))
        FW = k.flush_warps or fwarps
        records = records_fold(k.flush_fold or fold)
        if k.flush_maxnreg is DEFAULT:
            fmaxnreg = (mamba2_flush_maxnreg_default(cfg, BPF, FW, table=table) if records
                        else None)
        tma = resolve_flush_tma(k.flush_tma, cfg, P, BPF, ol, target, ckpt_data)
        flush = FlushPlan(
            fold="records" if records else "dot", rows=BPF, warps=FW,
            precision=fold_precision(k.flush_precision, ring_dtype, default_fold_precision(
                cfg, records, BPF, ring_dtype, table=table)),
            stages=k.flush_stages or flush_stages_for(cfg, tma, table=table), tma=tma,
            tiles=batch * H * triton.cdiv(P, BPF), per_sm=k.flush_per_sm, maxnreg=fmaxnreg,
            pdl=use_pdl and "flush" in pdl_edges, advances_cursor=advance and k.fuse_advance)
    base.update(step_flush_rows=fr, step_flush_fold=fr_fold)
    return StepPlan(**base, separate_advance=advance and not (ticket if ol else k.fuse_advance),
                    fused_prep=fp, prep_groups=pg, prep_grid=None if fp else (batch, G // pg),
                    prep_pdl=prep_pdl and not fp, step_pdl=step_pdl, flush=flush)


def gdn_step_plan(cfg, capacity: int, HV: int, HK: int, V: int, K: int, batch: int,
                  target: Target | torch.device, knobs: GdnKnobs = GDN_DEFAULTS, *,
                  ring_dtype: torch.dtype = torch.bfloat16,
                  ckpt_data: torch.Tensor | None = None) -> StepPlan:
    """The launches of ``gdn_decode_step`` for HV value heads of V rows x K key columns and
    HK key heads, ring capacity ``capacity`` (0: conventional), ``batch`` rows on
    ``target``, with its ``knobs``; every knob that needs the layer, batch or GPU is checked
    here, before any launch. ``ring_dtype`` (the keys') picks the flush's default products,
    ``ckpt_data`` lets the flush check that TMA can address the checkpoint."""
    k = knobs
    target, table = _target_table(target, k, HK, "key heads")
    fmaxnreg = k.given_flush_maxnreg
    src = cfg.read or cfg.ckpt
    # checked whatever the source
    nvfp4 = gdn_nvfp4_decode_of(k.nvfp4_decode, k.lut, table["gdn.nvfp4_decode"].value)
    decode = (nvfp4 if src.name == "nvfp4" else
              fp8_decode_of(k.fp8_decode, src.name, capacity,
                            gdn_fp8_decode_default(batch, table=table)))
    ol = resolve_one_launch(k.one_launch, batch, k.persistent_flush_knobs(),
                            conventional=capacity == 0, step_state=batch * HV * V * K,
                            light_flush=cfg.read is None and cfg.ckpt.name == "fp32", table=table)
    advance = k.advance and keeps_counters(cfg, capacity, table=table)
    ticket = ol and advance and k.fuse_advance  # each row's last program advances its cursor
    use_pdl, pdl_edges = resolve_pdl(k.pdl, target, table=table), pdl_edges_of(k.pdl)
    kb, kw = gdn_step_knobs(cfg, V, table=table)
    BV = k.block_v or small_grid_rows(cfg, kb, V, HV, batch, ol, table=table)
    tf = (gdn_tile_first(capacity, reads_narrow_copy(cfg), table=table) if k.tile_first is None
          else k.tile_first)
    tiles = triton.cdiv(V, BV)
    base = dict(kind="gdn", config=str(cfg), batch=batch, heads=HV, dim=V, d_state=K, groups=HK,
                capacity=capacity, target=target, one_launch=ol, ticket=ticket, rows=BV,
                rows2=0, tiles=tiles, tile_first=bool(tf), grid=step_grid(batch, HV, tiles, tf),
                warps=k.num_warps or kw, maxnreg=k.step_maxnreg, lut=bool(k.lut))
    if capacity == 0:
        return StepPlan(**base, separate_advance=advance and not ticket, fused_prep=False,
                        prep_groups=None, prep_grid=None, step_pdl=False, flush=None)
    # row passes of a one-launch flush: a knob only on GDN (no default measured yet)
    fr, fr_fold = check_step_flush(k.step_flush_rows, k.step_flush_fold, ol, BV, 0, ring_dtype)
    if fr_fold == "dot" and cfg.recompute_u:
        raise ValueError("step_flush_fold='dot' folds the ring's u records; a read copy's flush "
                         "recomputes them record by record (use 'records')")
    base.update(step_flush_rows=fr, step_flush_fold=fr_fold)
    fold, fblock, fwarps = gdn_flush_knobs(cfg, batch, table=table)
    records = records_fold(k.flush_fold or fold)
    ut = cfg.recompute_u and not records  # the flush solves the window with (I + M)^-T
    BVF = min(k.flush_block_v or fblock, triton.next_power_of_2(V))
    FW = k.flush_warps or fwarps
    fprec = fold_precision(k.flush_precision, ring_dtype,
                           default_fold_precision(cfg, records, BVF, ring_dtype, table=table))
    check_ut_tile(ut, fprec, BVF, FW)
    # the UT transform needs its own launch; otherwise small batches fold it away
    fp = ol or (not ut and (fused_prep_default(batch, table=table) if k.fuse_prep is None
                            else k.fuse_prep))
    if decode == "mma" and capacity and fp:
        raise ValueError("nvfp4_decode='mma' reads the fp16 pieces of k and q that the "
                         "ring-products launch writes: it needs a step with that launch "
                         "(fuse_prep=False and one_launch=False, the defaults from batch 5)")
    if k.maxnreg is DEFAULT:
        base["maxnreg"] = gdn_nonflush_maxnreg_default(decode, BV, base["warps"], kb, kw, fp,
                                                       table=table)
    pk = None if fp else (1 if ut else k.prep_groups
                          or gdn_prep_groups_default(cfg, batch, HK, table=table))
    flush = None
    if not ol:
        tma = resolve_flush_tma(k.flush_tma, cfg, V, BVF, ol, target, ckpt_data)
        if k.flush_maxnreg is DEFAULT:
            fmaxnreg = gdn_flush_maxnreg_default(cfg, records, BVF, FW, batch, table=table)
        flush = FlushPlan(
            fold="records" if records else "dot", rows=BVF, warps=FW, precision=fprec,
            stages=k.flush_stages or gdn_flush_stages(fprec, records, cfg, tma, table=table),
            tma=tma,
            tiles=batch * HV * triton.cdiv(V, BVF), per_sm=k.flush_per_sm, maxnreg=fmaxnreg,
            pdl=use_pdl and "flush" in pdl_edges, advances_cursor=advance and k.fuse_advance,
            recompute_u=cfg.recompute_u, ut=ut)
    return StepPlan(**base, separate_advance=advance and not (ticket if ol else k.fuse_advance),
                    fused_prep=fp, prep_groups=pk,
                    prep_grid=None if fp else (batch, HK // pk, HV // HK if ut else 1),
                    prep_pdl=use_pdl and "prep" in pdl_edges and not fp,
                    step_pdl=use_pdl and not fp and "prep" in pdl_edges, flush=flush,
                    decode=decode, early_loads=bool(k.early_loads))
