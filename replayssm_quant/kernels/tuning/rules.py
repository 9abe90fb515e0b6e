"""Default launch choices shared by the Mamba-2 and GDN steps (ring-products grouping, small-grid
tile rows, one launch per step, fused products, register caps of the verify), as rules over the
GPU family's tuning table.
"""

from __future__ import annotations

import torch
import triton

from . import table_for

TABLE = table_for()

PREP_ONE_WAVE: int = TABLE["prep.one_wave"].value


def prep_groups_default(batch: int, groups: int) -> int:
    """Groups (Mamba-2) or key heads (GDN) per ring-products program: the fewest, from 1 and
    doubling, that keep the launch within ``PREP_ONE_WAVE`` programs, so the products take one
    wave of memory round trips rather than two. Evidence: ``tuning.hopper`` entry ``prep.one_wave``."""
    pg = 1
    while batch * groups // pg > PREP_ONE_WAVE and groups % (2 * pg) == 0:
        pg *= 2
    return pg


def reads_narrow_copy(cfg) -> bool:
    """Whether a ReplaySSM non-flush step reads an fp8 or NVFP4 state (its read copy, or a
    narrow checkpoint when there is none)."""
    src = cfg.read or cfg.ckpt
    return src.name == "nvfp4" or src.name.startswith("fp8")


def flush_warps_default(cfg) -> int:
    """Warps per flush program: more when the checkpoint takes SR (the Philox words and the
    rounding spill with fewer). Evidence: ``tuning.hopper`` entry ``flush.warps``."""
    return TABLE["flush.warps"].value[bool(cfg.uses_sr)]


SMALL_GRID_PROGRAMS: int = TABLE["small_grid.programs"].value


SMALL_GRID_PROGRAMS_FP32: int = TABLE["small_grid.programs_fp32"].value


def small_grid_rows(cfg, rows: int, dim: int, heads: int, batch: int,
                    one_launch: bool = False) -> int:
    """Rows per program of a ReplaySSM non-flush step at small batch, halved while the grid
    would hold fewer programs than a floor, whose one warp each is then latency-bound; batch
    sizes with full grids keep ``rows``, and conventional steps never change. The floor is
    ``SMALL_GRID_PROGRAMS`` (down to 16 rows) for steps reading an fp8 / NVFP4 copy, and
    ``SMALL_GRID_PROGRAMS_FP32`` (down to 8 rows) for steps reading the fp32 state and for
    one-launch steps, whose programs also flush on these tiles.
    Evidence: ``tuning.hopper`` entries ``small_grid.programs``, ``small_grid.programs_fp32``."""
    if cfg.L == 1:
        return rows
    floor, least = ((SMALL_GRID_PROGRAMS, 16) if reads_narrow_copy(cfg) and not one_launch
                    else (SMALL_GRID_PROGRAMS_FP32, 8))
    while rows > least and batch * heads * triton.cdiv(dim, rows) < floor:
        rows //= 2
    return rows


FUSED_PREP_MAX_BATCH: int = TABLE["fused_prep.max_batch"].value


def fused_prep_default(batch: int) -> bool:
    """Whether a decode step skips its ring-products launch and lets every non-flush program
    form its group's / key head's products (``FUSED_PREP``): at small batch a launch costs
    more than the repeated products. Evidence: ``tuning.hopper`` entry ``fused_prep.max_batch``."""
    return batch <= FUSED_PREP_MAX_BATCH


ONE_LAUNCH_MAX_BATCH: int = TABLE["one_launch.max_batch"].value


ONE_LAUNCH_PASSES_MAX_BATCH: int = TABLE["one_launch.passes_max_batch"].value


ONE_LAUNCH_MAX_BATCH_CONV: int = TABLE["one_launch.max_batch_conv"].value


ONE_LAUNCH_MAX_STATE: int = TABLE["one_launch.max_state"].value


def keeps_counters(cfg, capacity: int) -> bool:
    """Whether a step advances the cursor and flush index: every ReplaySSM step, and a
    conventional one (no ring) only with SR, whose key is the flush index. Without SR a
    conventional step writes its state with no key and needs neither counter, so it skips the
    ticket atomic of a one-launch step and the separate advance launch of larger batches.
    Evidence: ``tuning.hopper`` entry ``one_launch.conventional_counters_need_sr``."""
    return capacity > 0 or cfg.uses_sr


def one_launch_default(batch: int, conventional: bool = False, step_state: int = 0,
                       light_flush: bool = False, passes: bool = False) -> bool:
    """Whether a decode step is one launch (``finish_row``):

    * a conventional step up to ``ONE_LAUNCH_MAX_BATCH_CONV`` (beyond it a row's programs queue
      on its counter);
    * a ReplaySSM step up to ``ONE_LAUNCH_MAX_BATCH`` while the step's state, ``step_state`` =
      batch x heads x state elements, is at most ``ONE_LAUNCH_MAX_STATE``: its flushing rows
      flush on the step's own tiles one after the other, and above that size the serial flush
      costs more than the launch it saves; above that size still one launch when the flush is
      light (``light_flush``: GDN's plain fp32 checkpoint, no read copy);
    * up to ``ONE_LAUNCH_PASSES_MAX_BATCH``, whatever the state's size, when the step's programs
      flush in row passes (``passes``: ``flush_passes_default``, ``step_flush_default``), so the
      flush holds no more registers than a pass.

    Larger batches keep the lean non-flush launch and the persistent flush, whose tiles are
    tuned apart. Evidence: ``tuning.hopper`` entries ``one_launch.*``."""
    if conventional:
        return batch <= ONE_LAUNCH_MAX_BATCH_CONV
    if passes:
        return batch <= ONE_LAUNCH_PASSES_MAX_BATCH
    return batch <= ONE_LAUNCH_MAX_BATCH and (step_state <= ONE_LAUNCH_MAX_STATE or light_flush)


def resolve_one_launch(one_launch: bool | None, batch: int, flush_knobs: tuple = (),
                       conventional: bool = False, step_state: int = 0,
                       light_flush: bool = False, passes: bool = False) -> bool:
    """The one-launch choice of a step: unless given, the default for the batch, step kind
    and size (``one_launch_default``), and off when any knob of the persistent flush
    (``flush_knobs``) is set, since that asks for that flush; asking for both is refused."""
    if one_launch and any(k is not None for k in flush_knobs):
        raise ValueError("the flush knobs set the persistent flush launch; one_launch=True "
                         "flushes on the step's own tiles, folding records one by one")
    if one_launch is None:
        return (one_launch_default(batch, conventional, step_state, light_flush, passes)
                and all(k is None for k in flush_knobs))
    return one_launch


def default_fold_precision(cfg, records: bool, rows: int, ring_dtype: torch.dtype) -> str:
    """The flush's default ``flush_precision``: ``"bf16x3"`` (exact bf16 pieces on tensor
    cores) for the ``"dot"`` fold without a u recompute, on tiles of 16+ rows (an MMA's least)
    over a bf16 ring; else ``"ieee"``. Narrow checkpoints with a read copy keep their record
    folds, whose SR and encode cost more in the MMA layout than the FMA fold saves.
    Evidence: ``tuning.hopper`` entry ``flush.dot_precision``."""
    ok = (not records and rows >= 16 and ring_dtype == torch.bfloat16
          and not cfg.recompute_u)
    return "bf16x3" if ok else "ieee"


VERIFY_MAXNREG: int = TABLE["verify.maxnreg"].value


VERIFY_CAP_MIN_BATCH: int = TABLE["verify.cap_min_batch"].value


def verify_maxnreg_default(batch: int) -> int | None:
    """Registers per thread of the speculative verify programs (both kinds) by default:
    ``VERIFY_MAXNREG`` from ``VERIFY_CAP_MIN_BATCH``, else no cap. Uncapped they take 254-255
    registers and a large batch's verify is bound by latency at that occupancy; at small batch,
    where the grid is small, the cap costs time.
    Evidence: ``tuning.hopper`` entry ``verify.maxnreg``, ``verify.cap_min_batch``."""
    return VERIFY_MAXNREG if batch >= VERIFY_CAP_MIN_BATCH else None
