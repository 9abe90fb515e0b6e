"""Default launch choices shared by the Mamba-2 and GDN steps (ring-products grouping, small-grid
tile rows, one launch per step, fused products, register caps of the verify), as rules over the
GPU family's tuning table.
"""

from __future__ import annotations

import torch
import triton

PREP_ONE_WAVE = 2048


def prep_groups_default(batch: int, groups: int) -> int:
    """Groups (Mamba-2) or key heads (GDN) per ring-products program: the fewest, from 1 and
    doubling, that keep the launch within ``PREP_ONE_WAVE`` programs (16 four-warp programs
    on each of the H200's 132 SMs hold 2112 at once), so the products take one wave of
    memory round trips rather than two. Measured on the H200
    (reports/kernels/profile_r137_prep_groups.log, tune_r137_prep_b*.log): the launch on
    Qwen3.5-4B / 122B took 8.4 -> 7.0 us at batch 256 and 14.5 -> 9.4 us at 512, on
    Nemotron-3-Super 7.5 -> 5.6 us at 512; replay-fp32 windows at batch 512: Qwen3.5-4B
    329.0 -> 324.6 us, 122B 626.4 -> 621.6, Super 581.7 -> 580.2, Nano-4B 557.7 -> 556.3;
    at batch 256 Qwen3.5-4B 171.9 -> 170.1 (122B unchanged)."""
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
    """Warps per flush program (tuned on the H200 at batch 256, reports/kernels): 8 when the
    checkpoint takes SR (the Philox words and the rounding spill at 4 warps), else 4."""
    return 8 if cfg.uses_sr else 4


SMALL_GRID_PROGRAMS = 512


SMALL_GRID_PROGRAMS_FP32 = 1024


def small_grid_rows(cfg, rows: int, dim: int, heads: int, batch: int,
                    one_launch: bool = False) -> int:
    """Rows per program of a ReplaySSM non-flush step at small batch, halved while the grid
    would hold fewer programs than a floor, whose one warp each is then latency-bound; batch
    sizes with full grids keep ``rows``, and conventional steps never change. Measured on the
    H200 at batch 1 (16 steps per CUDA graph):

    * reading an fp8 / NVFP4 copy: down to 16 rows below ``SMALL_GRID_PROGRAMS`` (512)
      programs; NVFP4 non-flush on Nemotron-3-Super 8.4 -> 7.1 us, Qwen3.5-4B 9.4 -> 7.8 us,
      Qwen3.5-122B 9.5 -> 7.9 us (reports/kernels/tune_r31_batch1_tiles.log);
    * reading the fp32 state itself: down to 8 rows below ``SMALL_GRID_PROGRAMS_FP32``
      (1024) programs; the replay-fp32 window on Nemotron-3-Nano-4B 7.9 -> 6.9 us, Super
      8.6 -> 6.9 us, Qwen3.5-4B 7.9 -> 6.9 us, Qwen3.5-122B 8.2 -> 7.6 us
      (reports/kernels/tune_r90_batch1.log);
    * one launch per step (``one_launch``), whose programs also flush: down to 8 rows below
      ``SMALL_GRID_PROGRAMS_FP32`` for every read, since the flush then runs on these tiles;
      the NVFP4 read over an fp16-SR checkpoint at batch 1, Nemotron-3-Super 5.3 -> 5.0 us,
      Qwen3.5-122B 6.5 -> 5.9 us (flush 18.5 -> 9.3 and 28.5 -> 12.1 us,
      reports/kernels/tune_r94_batch1_warps.log)."""
    if cfg.L == 1:
        return rows
    floor, least = ((SMALL_GRID_PROGRAMS, 16) if reads_narrow_copy(cfg) and not one_launch
                    else (SMALL_GRID_PROGRAMS_FP32, 8))
    while rows > least and batch * heads * triton.cdiv(dim, rows) < floor:
        rows //= 2
    return rows


FUSED_PREP_MAX_BATCH = 4


def fused_prep_default(batch: int) -> bool:
    """Whether a decode step skips its ring-products launch and lets every non-flush program
    form its group's / key head's products (``FUSED_PREP``): at small batch a launch costs
    more than the repeated products (reports/kernels/tune_r35_fused_prep.log)."""
    return batch <= FUSED_PREP_MAX_BATCH


ONE_LAUNCH_MAX_BATCH = 4


ONE_LAUNCH_PASSES_MAX_BATCH = 8


ONE_LAUNCH_MAX_BATCH_CONV = 1


ONE_LAUNCH_MAX_STATE = 1 << 21


def keeps_counters(cfg, capacity: int) -> bool:
    """Whether a step advances the cursor and flush index: every ReplaySSM step, and a
    conventional one (no ring) only with SR, whose key is the flush index. Without SR a
    conventional step writes its state with no key and needs neither counter, so it skips
    the ticket atomic that ends each program of a one-launch step and the separate advance
    launch of larger batches: measured on the H200 with every state from HBM, FP32 steps
    0.1-0.4 us faster at batch 1 and 2.0 us at batch 4 (Qwen3.5-4B 9.1 -> 7.1 us,
    Nemotron-3-Super 13.4 -> 11.4; reports/kernels/tune_r203_conv_advance.log)."""
    return capacity > 0 or cfg.uses_sr


def one_launch_default(batch: int, conventional: bool = False, step_state: int = 0,
                       light_flush: bool = False, passes: bool = False) -> bool:
    """Whether a decode step is one launch (``finish_row``), measured on the H200 with every
    state from HBM:

    * a conventional step at batch 1 only (Super 5.6 -> 4.8 us at batch 1, but 9.7 -> 10.7 us
      at batch 4, where a row's 512 programs queue on its counter;
      reports/kernels/tune_r93_ticket.log);
    * a ReplaySSM step up to batch 4 (replay-fp32 window on Nemotron-3-Nano-4B 7.1 -> 4.9 us
      at batch 1, tune_r93_ticket.log) while the step's state, ``step_state`` = batch x heads
      x state elements, is at most ``ONE_LAUNCH_MAX_STATE`` (2^21: Qwen3.5-4B at batch 4,
      the other paper shapes at batch 2). Its flushing rows flush on the step's own tiles,
      one after the other in each program, and above that size the serial flush costs more
      than the launch it saves: at batch 4 the NVFP4 read over an fp16-SR checkpoint
      takes 11.7 -> 9.6 us as two launches on Nemotron-3-Super, 22.8 -> 10.2 on Nano-4B,
      15.1 -> 10.4 on Qwen3.5-122B (tune_r211_small_batch_b4hbm.log, tune_r212_b4.log);
      at batch 2 one launch still wins (5.9 against 8.2 us on Super, tune_r212_b2.log).
      Smaller one-launch tiles did not rescue it (8 rows: 11.9 us on Super).
    * above that size still one launch when the flush is light (``light_flush``: GDN's plain
      fp32 checkpoint, no read copy): Qwen3.5-122B's replay-fp32 window at batch 4, 10.7
      against 12.2 us as two launches.

    * up to ``ONE_LAUNCH_PASSES_MAX_BATCH`` (8), whatever the state's size, when the step's
      programs flush in row passes (``passes``: Mamba-2's ReplaySSM steps,
      ``flush_passes_default``, ``step_flush_default``), so the flush holds no more registers
      than a pass: Nemotron-3-Super's replay-fp32 window 8.8 -> 6.7 us at batch 4 and 12.7
      -> 9.6 at 8 (reports/kernels/tune_r265_step_flush_batches.log).

    Larger batches keep the lean non-flush launch and the persistent flush, whose tiles are
    tuned apart (the one-launch flush folds on one-warp step tiles: 274 against 58 us at
    batch 16, tune_r92_one_launch.log; in passes 52.5-56.0 against 51.2, and at batch 256
    698-798 against 629 us with the non-flush steps no faster, tune_r263_step_flush.log)."""
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
    """The flush's default ``flush_precision``: ``"bf16x3"`` for the ``"dot"`` fold without a
    u recompute, on tiles of 16+ rows (an MMA's least) over a bf16 ring; else ``"ieee"``.
    Measured on the H200 at batch 256 against fp32 FMAs on 16-row one-warp tiles
    (reports/kernels/tune_r73_*_fp32_flush_bf16x3.log): the GDN fp32 flush Qwen3.5-4B 461 ->
    418 us, 122B 906 -> 817 us, and with 3 pipelining stages 362 / 709 us
    (``gdn_flush_stages``, tune_r74_fp32_flush_stages.log); Mamba-2 Nemotron-3-Nano-4B 657 ->
    648 us, Super 673 -> 660 us; the fp8 checkpoint's (shared-fp8) GDN flush on 16-row tiles
    541 -> 371 us (4B) and 1057 -> 712 us (122B, tune_r147_fp8_tiles.log); on Super's
    16-row four-warp tiles the nvfp4-read/fp16-sr flush 2325 (fp32 FMAs) -> 2094 us
    (tune_r146_dot_fold.log). Narrow checkpoints with a read copy keep their record folds
    (``MAMBA2_FLUSH_KNOBS``): in the MMA layout their SR and encode cost more than the FMA
    fold saves (the same log: 1409 us on 4-row record tiles)."""
    ok = (not records and rows >= 16 and ring_dtype == torch.bfloat16
          and not cfg.recompute_u)
    return "bf16x3" if ok else "ieee"


VERIFY_MAXNREG = 168


VERIFY_CAP_MIN_BATCH = 256


def verify_maxnreg_default(batch: int) -> int | None:
    """Registers per thread of the speculative verify programs (both kinds) by default:
    ``VERIFY_MAXNREG`` from batch 256, else no cap. Uncapped they take 254-255 (4 two-warp
    GDN programs or 8 one-warp Mamba-2 programs per SM) and a large batch's verify is bound
    by latency at that occupancy; at 168 an SM holds 6 / 12 of them with no spill in the
    state loop. Measured on the H200 (reports/kernels/tune_r116/r117/r118_verify_*.log), no
    cap -> 168 at batch 256: Qwen3.5-4B replay-fp32 271.5 -> 266.3-267.7 us (a conventional
    step 265.0), nvfp4-read/fp16-sr 217.9 -> 194.5 us; Qwen3.5-122B nvfp4-read/fp16-sr 403.6
    -> 355.7-358.5 us, replay-fp32 505-507 -> 497-517 us (spread); Nemotron-3-Super
    replay-fp32 395.9 -> 366.5-371.9 us, nvfp4-read/fp16-sr 285.3 -> 252.2 us; Nano-4B 447.7
    -> 446.4 and 349.8 -> 342.4 us. At batch 64 three of four cases gained 5-8% and
    Qwen3.5-4B replay-fp32 lost 4%; at batch 1, where the grid is small, the cap cost
    0.9-1.1 us in three of four. 144 spilled inside the GDN state loop (296 us at 256), 128
    was mixed for Mamba-2 (Super replay-fp32 457 us)."""
    return VERIFY_MAXNREG if batch >= VERIFY_CAP_MIN_BATCH else None
