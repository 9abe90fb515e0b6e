"""Default launch choices of the GDN decode kernels, as rules over the GPU family's tuning table.
"""

from __future__ import annotations

import triton

from .rules import flush_warps_default, prep_groups_default, reads_narrow_copy

WHOLE_ROW_PREP_MIN_BATCH = 256


def gdn_prep_groups_default(cfg, batch: int, key_heads: int) -> int:
    """Key heads per GDN ring-products program: every key head of a row in one program (the
    largest power of two dividing the key heads) for a step that reads an fp32 (not fp8 /
    NVFP4) state at batch >= ``WHOLE_ROW_PREP_MIN_BATCH``, else
    ``mamba2.prep_groups_default``. The non-flush launch starts (programmatic launch) once
    every products program has started, so fewer programs start it sooner: on the H200 the
    replay-fp32 non-flush kernel started 0.9 instead of 4.3 us into the step at batch 256
    with 8 key heads a program, and with 16 the window took 164.7 -> 163.1 us on Qwen3.5-4B
    and 313.0 -> 310.7 on Qwen3.5-122B (316.5 against 317.6 and 612.9 against 613.4-614.3 at
    512), while the narrow reads, bound by instruction issue, moved within -0.8 to +1.1 us
    and batch 64 lost up to 1 us
    (reports/kernels/tune_r217_gdn_prep.log, tune_r218_gdn_prep.log,
    timeline_r217_gdn_prep.log)."""
    if batch >= WHOLE_ROW_PREP_MIN_BATCH and not reads_narrow_copy(cfg):
        return key_heads & -key_heads
    return prep_groups_default(batch, key_heads)


def gdn_tile_first(capacity: int, narrow: bool = True) -> bool:
    """Default grid order (``tile_first``) of the GDN conventional / non-flush step, measured on
    the H200 at batch 256: (tiles, heads, rows) for the conventional step (Qwen3.5-122B 627 ->
    584 us, 4B 291.5 -> 285.5 us, reports/kernels/tune_r27_grid_order.log) and for the
    one-warp non-flush step that reads the state itself rather than an fp8 / NVFP4 copy
    (``narrow``; 4B 165.3 -> 158.5 us, 122B 308.1 -> 295.0 us, ``tune_r66/r67_fp32_tiles.log``);
    (rows, heads, tiles) for the narrow reads."""
    return capacity == 0 or not narrow


# From this batch the replays of an SR checkpoint's copies take 16-row four-warp tiles
# capped at 64 registers and an fp8 copy's replay is capped at 168 (gdn_flush_knobs,
# gdn_flush_maxnreg_default); below it they were 0-6.6% slower (tune_r252_new_tiles.log).
READ_COPY_FLUSH_MIN_BATCH = 64


def gdn_flush_knobs(cfg, batch: int = 256) -> tuple[str, int, int]:
    """(flush_fold, value rows, warps) defaults of the GDN flush at ``batch`` rows, measured
    on the H200 (reports/kernels/tune_r31_gdn_recompute_records.log): where the flush
    recomputes u (a narrow read copy), ``"records"`` replays the window from the checkpoint
    record by record: Qwen3.5-122B nvfp4-read/fp16-sr flush 4.4 -> 2.4 ms at batch
    256 and 31 -> 21 us at batch 1, against the UT transform's ``X (I + M)^-T``, whose
    products spilled; otherwise ``"dot"`` (the u's from the ring) on one-warp tiles for a
    checkpoint without SR: 16 rows for fp32 (Qwen3.5-122B 1432 -> 937 us, 4B 744 -> 457 us,
    reports/kernels/tune_r46_fp32_flush_*.log), 8 for fp8 / NVFP4 (shared-nvfp4 1829 ->
    1562 us and 932 -> 793 us, tune_r49_wave_flush_shared_*.log; the fp8 checkpoint on 16
    rows once its products run on tensor cores, 1028 -> 712 us and 521 -> 371 us,
    tune_r147_fp8_tiles.log), the NVFP4 checkpoint
    folding record by record once the keys load in the state's layout (1534 -> 1286 us and
    780 -> 657 us, tune_r53_flush_variants.log); else 32 rows and ``flush_warps_default`` warps.

    The replays of a read copy take 16 rows: an fp8 copy of an fp32 checkpoint on one warp
    (4B 1106 -> 1016 us, tune_r51), an NVFP4 copy of one on two warps and, from
    ``READ_COPY_FLUSH_MIN_BATCH``, an SR checkpoint's copies on four (32 rows on eight
    below it), the last two with the register caps of ``gdn_flush_maxnreg_default``. Window
    us against 16 rows on one warp (NVFP4 copy) and 32 rows on eight (SR, capped at 80 from
    batch 256) on Qwen3.5-4B / 122B (reports/kernels/tune_r252_new_tiles.log):

    - nvfp4-read/fp32: batch 8 8.5 / 13.1 against 9.6 / 14.1, batch 64 30.4 / 56.2 against
      33.9 / 58.2, batch 256 107.2 / 204.3 against 113.1 / 207.6, batch 512 206.4 / 400.0
      against 215.8 / 403.5 (L = 8: 3-10% faster, tune_r251_flush_tiles_window.log);
    - nvfp4-read/fp16-sr 1.4-2.7% faster from batch 64 (batch 256: 119.5 / 228.0 against
      122.8 / 233.6), nvfp4-read/fp8-sr 0.5-1.5%; at batch 8 and 16 they were 0-6.6%
      slower."""
    if cfg.recompute_u:
        if not cfg.uses_sr:  # fp8 / NVFP4 copy of an fp32 checkpoint
            return "records", 16, 2 if cfg.read.name == "nvfp4" else 1
        return ("records", 16, 4) if batch >= READ_COPY_FLUSH_MIN_BATCH else ("records", 32, 8)
    if cfg.ckpt.name == "nvfp4" and not cfg.uses_sr:  # 122B 1534 -> 1286 us (tune_r53)
        return "records", 8, 1
    if not cfg.uses_sr:  # fp32 or fp8 checkpoint (bf16x3 products on a bf16 ring)
        return "dot", 16, 1
    return "dot", 32, flush_warps_default(cfg)


def gdn_flush_stages(precision: str, records: bool, cfg=None, tma: bool = False) -> int | None:
    """Software-pipelining stages of the persistent GDN flush loop with the tensor-core
    ``"bf16x3"`` dot fold (H200, batch 256, one-warp 16-row tiles): 3 for an fp32 checkpoint
    loaded with cp.async (Qwen3.5-4B 416 -> 362 us, 122B 793 -> 709 us against Triton's
    choice, ``reports/kernels/tune_r74_fp32_flush_stages.log``); 2 for one loaded through TMA
    (``resolve_flush_tma``; 354.0 -> 350.7 and 690.7 -> 682.4 us against 3) and for an fp8
    checkpoint (shared-fp8: 371.0 -> 358.8 and 716.3 -> 700.5 us, tune_r152_tma.log; 371 ->
    360 and 712 -> 702 in tune_r148_fp8_stages.log); None (Triton's choice) otherwise, where
    1-3 stages moved the FMA fold by 2% or less."""
    if precision != "bf16x3" or records:
        return None
    return 2 if tma or (cfg is not None and cfg.ckpt.name.startswith("fp8")) else 3


def gdn_fp8_decode_default(batch: int) -> str:
    """``fp8_decode`` of a GDN step that reads an fp8 source: ``"words"`` at batch 1 and from
    batch 256, ``"cvt"`` between. Measured on the H200 (reports/kernels/tune_r220_b1_*.log,
    tune_r221_gdn_fp8.log), window us cvt -> words:

    - batch 1, every state from HBM (conventional 4.7 / 5.4 us): fp8-read/fp32 on Qwen3.5-4B
      5.5 -> 5.1, on 122B 6.1 -> 5.7; shared-fp8 5.3 -> 5.1 and 5.8 -> 5.7;
    - batch 4 and 64: 0-0.8 and 1.0-2.2 us slower;
    - batch 256: fp8-read/fp32 134.6 -> 132.9 and 259.7 -> 252.9, shared-fp8 98.4 -> 97.1
      and 188.9 -> 183.2 (L = 8: -2.7 to +0.9)."""
    return "words" if batch == 1 or batch >= 256 else "cvt"


def gdn_nonflush_maxnreg_default(decode: str, rows: int, warps: int, default_rows: int,
                                 default_warps: int, fused: bool) -> int | None:
    """The register cap of a GDN non-flush program left at its default ``maxnreg``, measured
    on the H200: 80 for an fp8 source decoded from int32 words (``fp8_decode="words"``, the
    default from batch 256) on its default one-warp 32-row tiles, in a step of separate
    launches. It takes 96 registers uncapped and 80 capped, with 1584 instructions instead of
    1544 and no spills; an SM then holds 24 one-warp programs instead of 20
    (``persistent.programs_per_sm``). The non-flush step is 6.9-9.1% faster and the window
    4.1-6.2%: fp8-read/fp32 78.5 -> 72.9 and 150.1 -> 137.3 us on Qwen3.5-4B, 144.5 -> 132.5
    and 283.5 -> 257.6 us on 122B at batch 256 / 512 (reports/kernels/
    tune_r244_regcap_default.log, tune_r243_nonflush_regcap.log). Elsewhere
    None: the byte-tile decode takes 158 registers and spills at 80, an NVFP4 source spills
    at 80 and ran 2-4% slower, and a step with its ring products fused in holds more."""
    if (decode == "words8" and rows == default_rows and warps == default_warps == 1
            and not fused):
        return 80
    return None


def gdn_flush_maxnreg_default(cfg, records: bool, rows: int, warps: int, batch: int) -> int | None:
    """The register cap of a GDN flush program left at its default ``flush_maxnreg``,
    measured on the H200, where the flush replays the window record by record on its
    default tiles at ``batch`` (``gdn_flush_knobs``; programs per SM from
    ``persistent.programs_per_sm``):

    - an SR checkpoint's copies, from ``READ_COPY_FLUSH_MIN_BATCH`` (16 rows on 4 warps):
      64. 96-127 registers and 4-5 programs per SM uncapped, 64 with 64-71 spill
      instructions and 8 per SM; the flush alone at batch 256 1140.5 -> 1097.1 us
      (nvfp4-read/fp16-sr, Qwen3.5-4B) and 1265.1 -> 1208.5 (fp8-sr),
      reports/kernels/tune_r250_flush_tiles.log;
    - an NVFP4 copy of an fp32 checkpoint (16 rows on 2 warps): 128. 158 registers and 6
      per SM uncapped, 128 with 1 spill instruction and 8 per SM;
    - an fp8 copy of an fp32 checkpoint (16 rows on 1 warp), from
      ``READ_COPY_FLUSH_MIN_BATCH``: 168. 225 registers and 8 per SM uncapped, 168 with
      6-21 spill instructions and 12 per SM. Flush us without -> with the cap at batch 256 /
      512 on Qwen3.5-4B and 122B (tune_r247_flush_caps.log): 920.7 -> 875.4, 1821.4 ->
      1709.3, 1807.1 -> 1679.3, 3593.1 -> 3332.3; windows 6.2-9.4% faster
      (tune_r249_flush_cap_default.log), at batch 64 36.5 -> 34.6 and 66.0 -> 61.7 us, at
      batch 8 8.0 -> 8.2 and 13.7 -> 13.7 (tune_r252_new_tiles.log). Its 8-row tiles at 96
      and two-warp tiles at 128 ran the flush alone 3-8% faster at batch 256 but the windows
      0.4-1.8% slower (tune_r250, tune_r251).

    Elsewhere None: the NVFP4 checkpoint's flush ran 2.8-4.2% slower at 128, and Mamba-2's
    flushes at the next step ran 1.3% faster to 9.7% slower."""
    if not (records and cfg.recompute_u):
        return None
    if (rows, warps) != gdn_flush_knobs(cfg, batch)[1:]:
        return None
    if cfg.read.name == "nvfp4" and not cfg.uses_sr:
        return 128
    if batch < READ_COPY_FLUSH_MIN_BATCH:
        return None
    return 64 if cfg.uses_sr else (168 if cfg.read.name.startswith("fp8") else None)


def gdn_step_knobs(cfg, V: int) -> tuple[int, int]:
    """(value rows, warps) per program of the conventional / non-flush step, measured on the
    H200 at batch 256 (reports/kernels): conventional 32 rows / 8 warps, 8 / 2 with fp16 SR
    (Qwen3.5-122B 624 -> 588 us, ``tune_r14_small_tiles.log``), 16 / 1 for an fp32 state
    (4B 281 -> 269 us, 122B 582 -> 555-580 us, ``tune_r66/r67_fp32_tiles.log``); non-flush
    32 rows / 1 warp (tile-first: 4B 171.8 -> 158.5 us, 122B 325.0 -> 295.0 us against 2 warps,
    same logs), 64 rows / 1 warp reading an NVFP4 copy (NVFP4 on
    Qwen3.5-4B 168 -> 69 us, ``tune_r11_nvfp4.log``), 32 rows / 1 warp reading an fp8 one: at
    64 rows its two row products take 255 registers and spill (fp8-read/fp32 on Qwen3.5-4B
    93.1 -> 90.3 us, 122B 167.4 -> 165.2 us, ``tune_r60_gdn_fp8_nonflush.log``)."""
    vp = triton.next_power_of_2(V)
    if cfg.L == 1:
        if cfg.uses_sr and cfg.ckpt.name == "fp16":
            return min(vp, 8), 2
        return (min(vp, 16), 1) if cfg.ckpt.name == "fp32" else (min(vp, 32), 8)
    if reads_narrow_copy(cfg):
        return (min(vp, 32 if (cfg.read or cfg.ckpt).name.startswith("fp8") else 64), 1)
    return min(vp, 32), 1
