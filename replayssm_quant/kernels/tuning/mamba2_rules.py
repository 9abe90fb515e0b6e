"""Default launch choices of the Mamba-2 decode and verify kernels, as rules over the GPU
family's tuning table.
"""

from __future__ import annotations

import torch
import triton

from .rules import flush_warps_default, reads_narrow_copy


def block_p_default(P: int, N: int) -> int:
    """Head-dim rows per decode program: the largest power of two up to 64 (32 when
    d_state > 128) whose tiles pad P by at most a quarter. Nemotron-3-Nano's head_dim 80 takes
    32 (96 rows) rather than 64 (128 rows): its non-flush step ran 299 instead of 355 us at
    batch 256 on the H200 (reports/kernels/tune_r7_nano_122b.log)."""
    b = min(triton.next_power_of_2(P), 64 if N <= 128 else 32)
    while b > 16 and triton.cdiv(P, b) * b * 4 > P * 5:
        b //= 2
    return b


STEP_FLUSH_PASS_ROWS = 8


STEP_FLUSH_DOT_ROWS = 16


def flush_passes_default(cfg, P: int) -> bool:
    """Whether a Mamba-2 ReplaySSM step's one-launch programs, where they would flush in row
    passes (``step_flush_default``: more than 16 rows), make the step one launch up to
    ``ONE_LAUNCH_PASSES_MAX_BATCH`` (``one_launch_default``): every config except an SR
    checkpoint on heads of more than 64 rows, whose whole-head programs
    (Nemotron-3-Nano-4B's 80 rows in ten passes) flush as one long chain. Measured on the
    H200 (reports/kernels/tune_r265_step_flush_batches.log): Nano-4B's nvfp4-read/fp16-sr
    window 8.6 -> 8.8 us at batch 4 and 10.0 -> 9.9 at 8, its flush 25.5 -> 49.0 and 45.7
    -> 65.2 us."""
    return not (cfg.uses_sr and P > 64)


def step_flush_default(cfg, BP: int, BP2: int, ring_dtype: torch.dtype) -> tuple[int | None, str | None]:
    """(``step_flush_rows``, ``step_flush_fold``) of a one-launch step left at their defaults:
    a program of more rows than one pass flushes them in passes, a plain fp32 checkpoint (no
    read copy, bf16 ring) on passes of 16 rows folded as one bf16x3 product, every other
    config on passes of 8 rows folded record by record; a program of 16 rows or fewer
    (batch 1-2, whose grids shrink to 8-16 rows) flushes them at once, as before. Measured on
    the H200, window us (two launches or the one-launch flush at once -> passes;
    reports/kernels/tune_r264_step_flush_small.log, tune_r265_step_flush_batches.log):

    * Nemotron-3-Super, batch 4: replay-fp32 8.8 -> 6.7 (8 rows: 6.8; at once in one launch
      8.0, its flush 34.5 against 11.9 us), nvfp4-read/fp16-sr 7.7 -> 6.0, fp8-read/fp32 7.2
      -> 5.8, nvfp4-read/fp32 7.6 -> 5.7; batch 8: 12.7 -> 9.6, 10.0 -> 8.1, 8.8 -> 8.5,
      10.5 -> 8.2;
    * Nano-4B (whole-head programs of 64 + 16 rows, ``whole_head_default``), batch 4: 8.9 ->
      7.2, fp8-read/fp32 7.5 -> 6.8, nvfp4-read/fp32 8.6 -> 8.3; batch 8: 12.6 -> 9.6, 10.3
      -> 8.7, 10.4 -> 9.4;
    * batch 16 and up the persistent flush wins back (Super replay-fp32 28.5 against 26.0-26.7
      at 16 but nvfp4-read/fp16-sr 15.3 against 15.8; at 32 every preset 0.5-23% slower in one
      launch), hence ``ONE_LAUNCH_PASSES_MAX_BATCH``."""
    rows = BP + BP2
    plain = cfg.read is None and cfg.ckpt.name == "fp32" and ring_dtype == torch.bfloat16
    fr = STEP_FLUSH_DOT_ROWS if plain else STEP_FLUSH_PASS_ROWS
    if rows <= STEP_FLUSH_DOT_ROWS or BP % fr or BP2 % fr:
        return None, None
    return fr, "dot" if plain else "records"


def mamba2_tile_first(capacity: int, P: int, block_p: int, narrow: bool = True) -> bool:
    """Default grid order of the conventional / non-flush step (``tile_first``,
    ``common.row_head_tile``), measured on the H200 at batch 256
    (reports/kernels/tune_r27_grid_order.log): (tiles, heads, rows) for the conventional
    step, whose programs then read and write one slot's state in order (Nemotron-3-Super
    626 -> 590 us, Nano-4B 600 -> 560 us), for non-flush steps whose heads take more than
    one tile (Nano-4B's 80 rows: 283 -> 264 us) and for non-flush steps that read the state
    itself rather than an fp8 / NVFP4 copy (``narrow``; Super's one-warp 64-row tiles 289 ->
    283 us, ``tune_r65/r66_fp32_tiles.log``); (rows, heads, tiles) otherwise.

    A whole-head grid (``whole_head``, one tile per head) orders heads before rows when it
    reads the state itself and rows first for an fp8 / NVFP4 copy (``mamba2_step_plan``):
    Nemotron-3-Nano-4B's replay-fp32 window 283.8 -> 280.2 us at batch 256 (three interleaved
    runs, non-flush 264.1 -> 260.4), 559.1 -> 551.2 at 512, while the narrow reads were
    0.3-0.6 us slower heads first (reports/kernels/tune_r180_nano_tile_first.log)."""
    return capacity == 0 or triton.cdiv(P, block_p) > 1 or not narrow


def flush_stages_for(cfg, tma: bool = False) -> int | None:
    """Software-pipelining stages of the persistent Mamba-2 flush loop (H200, batch 256,
    reports/kernels): for a plain fp32 checkpoint, whose flush is bound by load latency, 3
    with cp.async loads (Nemotron-3-Super 1219 -> 815 us, Nano-4B 1330 -> 881 us) and 2 with
    TMA loads (``resolve_flush_tma``; Super 627.8 -> 622.4 us, Nano-4B 587.3 -> 579.9 against
    3, tune_r152_tma.log); otherwise None, Triton's own choice, which was faster for SR and
    read-copy flushes than either 1 or 3 stages."""
    if cfg.ckpt.name == "fp32" and cfg.read is None:
        return 2 if tma else 3
    return None


def whole_head_rows(P: int, N: int) -> tuple[int, int] | None:
    """Two power-of-two row passes ``(BP, BP2)`` that cover a head dim ``P`` that is no power of
    two with as little padding as two passes allow (Nemotron-3-Nano's 80: 64 + 16), or None
    when ``P`` is one tile already or the first pass would exceed the non-flush tile limit."""
    cap = 64 if N <= 128 else 32
    bp = 1 << (P.bit_length() - 1)
    if bp == P or bp > cap or P - bp > bp:
        return None
    return bp, triton.next_power_of_2(P - bp)


def mamba2_nonflush_maxnreg_default(decode: str, rows2: int, warps: int, default_warps: int,
                                    fused: bool, batch: int) -> int | None:
    """The register cap of a Mamba-2 non-flush program left at its default ``maxnreg``,
    measured on the H200: 80 from batch 256 for a whole-head program of two passes
    (Nemotron-3-Nano-4B's 64 + 16 rows) that decodes an NVFP4 source through E4M3 bytes, on
    its default one warp. It takes 96 registers uncapped and 80 capped, with the same 2336
    instructions and no spills; an SM then holds 24 one-warp programs instead of 20
    (``persistent.programs_per_sm``), and the non-flush step is 1.1-2.2% faster at batch
    256 and 1.5-2.0% at 512 (reports/kernels/tune_r244_regcap_default.log; a cap of 88,
    still 20 programs per SM, was 1.4-2.5% slower, tune_r243_nonflush_regcap.log). At batch
    16 and 64 the three NVFP4 presets moved both ways (-6.9% to +2.0%, 0.1-0.8 us), so the
    cap waits for batch 256. Elsewhere None: Nemotron-3-Super's program takes 72 registers
    uncapped and 80 under that cap (28 -> 24 programs per SM), an fp8 source spills at 80,
    and a step with its ring products fused in holds more."""
    if (decode == "e4m3" and rows2 > 0 and warps == default_warps == 1 and not fused
            and batch >= 256):
        return 80
    return None


def whole_head_default(cfg, one_launch: bool = False, passes: bool = False) -> bool:
    """Whether a non-flush step covers each head in one program (``whole_head``) by default,
    measured on the H200 (reports/kernels):

    * steps reading an fp8 / NVFP4 copy, which are bound by instruction issue, so padding rows
      and a second program per head cost time (batch 256, tune_r57_whole_head.log);
    * steps reading an fp32 state, except one-launch steps (small batches): Nemotron-3-Nano-4B's
      replay-fp32 window with one one-warp program per head (rows 64 + 16) instead of three
      32-row programs, 294.3 -> 287.2 us at batch 256, 572.0 -> 559.5 at 512, 79.9 -> 78.7 at
      64 and 27.1 -> 26.1 at 16. A flush step then ends its non-flush launch of exiting
      programs sooner (632 -> 600 us at 256), and the non-flush step is faster too (271.9 ->
      266.4 us) (tune_r132_nano_whole_head*.log). One-launch steps whose programs flush in
      row passes (``passes``, ``step_flush_default``) take whole heads too: Nano-4B's
      replay-fp32 window 9.3 -> 7.2 us at batch 4 and 14.4 -> 9.6 at 8 against 32-row
      programs (reports/kernels/tune_r265_step_flush_batches.log)."""
    return cfg.L > 1 and (reads_narrow_copy(cfg) or not one_launch or passes)


def early_loads_default(cfg, batch: int, one_launch: bool) -> bool:
    """Whether a Mamba-2 non-flush step issues its output's loads before its cursor arrives
    (``early_loads``) by default, measured on the H200: a one-launch step at batch 1 that
    reads an fp32 state (``replay-fp32``), where the loads of the state, the ring and the
    cursor then overlap. With every state from HBM its window went 5.5 -> 5.3 us on
    Nemotron-3-Super and 5.6 -> 5.1 on Nano-4B (L = 16), 5.8 -> 5.3 and 5.7 -> 5.2 (L = 8);
    from L2 4.3 -> 4.4, 4.3 -> 4.2, 4.5 -> 4.3, 4.4 -> 4.1
    (reports/kernels/tune_r207_mamba2_early.log). A step reading an fp8 / NVFP4 copy keeps
    its loads after the cursor: its flush steps, whose programs also form the discarded
    non-flush output, took 0.2-2.2 us longer (1.1-1.4 for most), so its windows gained
    nothing (-0.2 to +0.3 us). Batches 2-4 are not fully measured with it
    (tune_r210_mamba2_early_b4.log)."""
    return one_launch and batch == 1 and (cfg.read or cfg.ckpt).name == "fp32"


def mamba2_step_knobs(cfg, P: int, N: int) -> tuple[int, int]:
    """(head-dim rows, warps) per program of the conventional / non-flush step, measured on
    the H200 at batch 256 (reports/kernels):

    * conventional step with SR: 8 rows, 2 warps (Philox and the rounding are the work; fp16-SR
      on Nemotron-3-Super 795 -> 596 us, bf16-SR 562 -> 424 us, ``tune_r14_small_tiles.log``);
    * non-flush step reading an fp8 / NVFP4 copy: one warp per tile, which is bound by
      instruction issue, not bytes (NVFP4 on Super 175 -> 84 us, ``tune_r11_nvfp4.log``);
    * conventional step of an fp32 state: 16 rows, one warp (Nemotron-3-Nano-4B 557 -> 543 us,
      Super 588 -> 575 us against ``block_p_default`` rows and 4 warps, ``tune_r66/r67_fp32_tiles.log``);
    * otherwise ``block_p_default`` rows and one warp: the non-flush step with one warp per 32 rows
      ran Nemotron-3-Nano-4B 300 -> 280 us (``tune_r14_small_tiles.log``), and with one warp
      on Super's 64-row tiles, tile-first, 289 -> 283 us (``tune_r65/r66_fp32_tiles.log``)."""
    bp = block_p_default(P, N)
    if cfg.L == 1:
        if cfg.uses_sr:
            return min(8, triton.next_power_of_2(P)), 2
        return (min(16, triton.next_power_of_2(P)), 1) if cfg.ckpt.name == "fp32" else (bp, 4)
    return bp, 1


# Mamba-2 flush knobs (fold, tile rows, warps) measured fastest on the H200 at batch 256 for
# Nemotron-3-Nano-4B and -Super (reports/kernels/tune_r12_flush_fold.log; the read-copy
# flushes of an fp32 checkpoint with one-warp tiles: tune_r39_flush_warps_m2.log; the plain
# fp32 checkpoint's, Super 892 -> 692-741 us: tune_r46_fp32_flush_*.log; the NVFP4 read
# copy over an fp16-SR checkpoint, 1782 -> 1640 us: tune_r49_wave_flush_*.log, then on 16
# rows of two warps capped at 168 registers (``MAMBA2_FLUSH_MAXNREG``), windows 2.1-2.5%
# faster at batch 256-512: tune_r253_m2_flush_tiles.log, tune_r254_m2_sr_tiles.log; over fp8-SR
# and the fp8 / NVFP4 checkpoints without a read copy: tune_r51_wave_flush_m2.log; the
# record folds of the fp8 copy of an fp32 checkpoint, Nano-4B 1650 -> 1290 us, and of the
# NVFP4 checkpoint, 1347 -> 1150 us, once B_j arrives in the fold's layout:
# tune_r53_flush_variants.log; since the e4m3 roundings' integer and hardware forms, the
# NVFP4 copy of an fp8-SR checkpoint on 8-row tiles, Super 1861 -> 1810 us, and the fp8
# checkpoint's bf16x3 products on 16-row one-warp tiles, 947 -> 518 us and Nano-4B 877 ->
# 471 (two warps 666-736 and 626-687 us): tune_r147_fp8_tiles.log, tune_r148_fp8_stages.log),
# keyed by (checkpoint format, SR, read-copy format); other
# configs keep (dot, 32, flush_warps_default).
MAMBA2_FLUSH_KNOBS: dict[tuple[str, bool, str | None], tuple[str, int, int]] = {
    ("fp32", False, None): ("dot", 16, 1),
    ("fp32", False, "nvfp4"): ("records", 8, 1),
    ("fp32", False, "fp8e4m3"): ("records", 8, 1),
    ("fp16", True, "nvfp4"): ("records", 16, 2),
    ("fp8e4m3", True, "nvfp4"): ("records", 8, 1),
    ("fp8e4m3", False, None): ("dot", 16, 1),
    ("nvfp4", False, None): ("records", 8, 1),
}


def flush_key(cfg) -> tuple[str, bool, str | None]:
    return (cfg.ckpt.name, cfg.uses_sr, cfg.read.name if cfg.read is not None else None)


def mamba2_flush_knobs(cfg) -> tuple[str, int, int]:
    """(flush_fold, flush tile rows, flush warps) defaults for a config."""
    return MAMBA2_FLUSH_KNOBS.get(flush_key(cfg), ("dot", 32, flush_warps_default(cfg)))


# Register caps of Mamba-2 flush programs on their default tiles (``MAMBA2_FLUSH_KNOBS``),
# keyed the same way; ``mamba2_flush_maxnreg_default`` says what was measured.
MAMBA2_FLUSH_MAXNREG: dict[tuple[str, bool, str | None], int] = {
    ("fp16", True, "nvfp4"): 168,
}


def mamba2_flush_maxnreg_default(cfg, rows: int, warps: int) -> int | None:
    """The register cap of a Mamba-2 flush program left at its default ``flush_maxnreg``, on
    its default tiles (``mamba2_flush_knobs``; other tiles take no cap), measured on the
    H200: 168 for the NVFP4 copy of an fp16-SR checkpoint, whose 16-row two-warp tiles take
    244-252 registers and 4 programs per SM uncapped, 168 with 4 spill instructions and 6
    per SM. Windows against its earlier 4-row one-warp tiles without a cap, Nemotron-3-Super
    / Nano-4B (reports/kernels/tune_r254_m2_sr_tiles.log, tune_r255_m2_sr_small.log): batch
    256 154.7 -> 151.5 / 160.4 -> 156.9 us, 512 302.4 -> 295.0 / 314.3 -> 306.4, at L = 8
    0.1-0.5% faster; batch 4-64 0-4.9% faster, one window 0.5% slower (Nano-4B, L = 8, batch
    64). Uncapped the same tiles were 1.0-5.4% slower than the earlier ones (163.4 / 163.0
    against 155.1 / 161.2 us at batch 256, tune_r253_m2_flush_tiles.log)."""
    cap = MAMBA2_FLUSH_MAXNREG.get(flush_key(cfg))
    return cap if cap is not None and (rows, warps) == mamba2_flush_knobs(cfg)[1:] else None


def verify_block(P: int) -> int:
    """Head-dim rows per verify program: 64 or 32, whichever pads P least (64 on a tie);
    Nemotron-3-Nano-4B's 80 rows take 32 (reports/kernels/verify_r21_sweep.log)."""
    return min((64, 32), key=lambda b: (triton.cdiv(P, b) * b, -b))
