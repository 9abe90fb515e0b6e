"""Default launch choices shared by the Mamba-2 and GDN steps (ring-products grouping, small-grid
tile rows, one launch per step, fused products, register caps of the verify), as rules over the
GPU family's tuning table: each takes the ``table`` of the target it plans for
(``tuning.table_for``; ``DEFAULT_TABLE`` when not given).
"""

from __future__ import annotations

import torch
import triton

from . import DEFAULT_TABLE, Table


def prep_groups_default(batch: int, groups: int, *, table: Table = DEFAULT_TABLE) -> int:
    """Groups (Mamba-2) or key heads (GDN) per ring-products program: the fewest, from 1 and
    doubling, that keep the launch within ``prep.one_wave`` programs, so the products take one
    wave of memory round trips rather than two. Evidence: ``tuning.hopper`` entry ``prep.one_wave``."""
    one_wave = table["prep.one_wave"].value
    pg = 1
    while batch * groups // pg > one_wave and groups % (2 * pg) == 0:
        pg *= 2
    return pg


def reads_narrow_copy(cfg) -> bool:
    """Whether a ReplaySSM non-flush step reads an fp8 or NVFP4 state (its read copy, or a
    narrow checkpoint when there is none)."""
    src = cfg.read or cfg.ckpt
    return src.name == "nvfp4" or src.name.startswith("fp8")


def flush_warps_default(cfg, *, table: Table = DEFAULT_TABLE) -> int:
    """Warps per flush program: more when the checkpoint takes SR (the Philox words and the
    rounding spill with fewer). Evidence: ``tuning.hopper`` entry ``flush.warps``."""
    return table["flush.warps"].value[bool(cfg.uses_sr)]


def small_grid_rows(cfg, rows: int, dim: int, heads: int, batch: int,
                    one_launch: bool = False, *, table: Table = DEFAULT_TABLE) -> int:
    """Rows per program of a ReplaySSM non-flush step at small batch, halved while the grid
    would hold fewer programs than a floor, whose one warp each is then latency-bound; batch
    sizes with full grids keep ``rows``, and conventional steps never change. The floor is
    ``small_grid.programs`` (down to 16 rows) for steps reading an fp8 / NVFP4 copy, and
    ``small_grid.programs_fp32`` (down to 8 rows) for steps reading the fp32 state and for
    one-launch steps, whose programs also flush on these tiles.
    Evidence: ``tuning.hopper`` entries ``small_grid.programs``, ``small_grid.programs_fp32``."""
    if cfg.L == 1:
        return rows
    floor, least = ((table["small_grid.programs"].value, 16)
                    if reads_narrow_copy(cfg) and not one_launch
                    else (table["small_grid.programs_fp32"].value, 8))
    while rows > least and batch * heads * triton.cdiv(dim, rows) < floor:
        rows //= 2
    return rows


def fused_prep_default(batch: int, *, table: Table = DEFAULT_TABLE) -> bool:
    """Whether a decode step skips its ring-products launch and lets every non-flush program
    form its group's / key head's products (``FUSED_PREP``): at small batch a launch costs
    more than the repeated products. Evidence: ``tuning.hopper`` entry ``fused_prep.max_batch``."""
    return batch <= table["fused_prep.max_batch"].value


def keeps_counters(cfg, capacity: int, *, table: Table = DEFAULT_TABLE) -> bool:
    """Whether a step advances the cursor and flush index: every ReplaySSM step, and a
    conventional one (no ring) only with SR, whose key is the flush index. Without SR a
    conventional step writes its state with no key and needs neither counter, so it skips the
    ticket atomic of a one-launch step and the separate advance launch of larger batches.
    Evidence: ``tuning.hopper`` entry ``one_launch.conventional_counters_need_sr``."""
    return (capacity > 0 or cfg.uses_sr
            or not table["one_launch.conventional_counters_need_sr"].value)


def one_launch_default(batch: int, conventional: bool = False, step_state: int = 0,
                       light_flush: bool = False, passes: bool = False, *,
                       table: Table = DEFAULT_TABLE) -> bool:
    """Whether a decode step is one launch (``finish_row``):

    * a conventional step up to ``one_launch.max_batch_conv`` (beyond it a row's programs
      queue on its counter);
    * a ReplaySSM step up to ``one_launch.max_batch`` while the step's state, ``step_state`` =
      batch x heads x state elements, is at most ``one_launch.max_state``: its flushing rows
      flush on the step's own tiles one after the other, and above that size the serial flush
      costs more than the launch it saves; above that size still one launch when the flush is
      light (``light_flush``: GDN's plain fp32 checkpoint, no read copy);
    * up to ``one_launch.passes_max_batch``, whatever the state's size, when the step's
      programs flush in row passes (``passes``: ``flush_passes_default``,
      ``step_flush_default``), so the flush holds no more registers than a pass.

    Larger batches keep the lean non-flush launch and the persistent flush, whose tiles are
    tuned apart. Evidence: ``tuning.hopper`` entries ``one_launch.*``."""
    if conventional:
        return batch <= table["one_launch.max_batch_conv"].value
    if passes:
        return batch <= table["one_launch.passes_max_batch"].value
    return batch <= table["one_launch.max_batch"].value and (
        step_state <= table["one_launch.max_state"].value or light_flush)


def resolve_one_launch(one_launch: bool | None, batch: int, flush_knobs: tuple = (),
                       conventional: bool = False, step_state: int = 0,
                       light_flush: bool = False, passes: bool = False, *,
                       table: Table = DEFAULT_TABLE) -> bool:
    """The one-launch choice of a step: unless given, the default for the batch, step kind
    and size (``one_launch_default``), and off when any knob of the persistent flush
    (``flush_knobs``) is set, since that asks for that flush; asking for both is refused."""
    if one_launch and any(k is not None for k in flush_knobs):
        raise ValueError("the flush knobs set the persistent flush launch; one_launch=True "
                         "flushes on the step's own tiles, folding records one by one")
    if one_launch is None:
        return (one_launch_default(batch, conventional, step_state, light_flush, passes,
                                   table=table)
                and all(k is None for k in flush_knobs))
    return one_launch


def default_fold_precision(cfg, records: bool, rows: int, ring_dtype: torch.dtype, *,
                           table: Table = DEFAULT_TABLE) -> str:
    """The flush's default ``flush_precision``: ``flush.dot_precision`` (``"bf16x3"``, exact
    bf16 pieces on tensor cores) for the ``"dot"`` fold without a u recompute, on tiles of 16+
    rows (an MMA's least) over a bf16 ring; else ``"ieee"``. Narrow checkpoints with a read
    copy keep their record folds, whose SR and encode cost more in the MMA layout than the FMA
    fold saves. Evidence: ``tuning.hopper`` entry ``flush.dot_precision``."""
    ok = (not records and rows >= 16 and ring_dtype == torch.bfloat16
          and not cfg.recompute_u)
    return table["flush.dot_precision"].value if ok else "ieee"


def verify_maxnreg_default(batch: int, *, table: Table = DEFAULT_TABLE) -> int | None:
    """Registers per thread of the speculative verify programs (both kinds) by default:
    ``verify.maxnreg`` from ``verify.cap_min_batch``, else no cap. Uncapped they take 254-255
    registers and a large batch's verify is bound by latency at that occupancy; at small batch,
    where the grid is small, the cap costs time.
    Evidence: ``tuning.hopper`` entry ``verify.maxnreg``, ``verify.cap_min_batch``."""
    return table["verify.maxnreg"].value if batch >= table["verify.cap_min_batch"].value else None
