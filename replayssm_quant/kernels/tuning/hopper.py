"""Launch choices for Hopper GPUs (sm_90), measured on the H200.

Each entry is a value the rules in ``rules.py``, ``mamba2_rules.py`` and ``gdn_rules.py`` read,
with a one-line pointer to the measurement that chose it: the commit that made it the default
and the benchmark that timed it (``benchmarks/tune_decode.py`` for launch variants,
``benchmarks/decode.py`` for the sweep). "Window" is the time of one ReplaySSM window of L steps
per step, as the benchmarks report it.
"""

from __future__ import annotations

from .choice import Choice

HOPPER: dict[str, Choice] = {
    # ---------------------------------------------------------------- shared by both kinds
    "prep.one_wave": Choice(
        2048,
        "a076965: tune_decode batch 256-512: products launch 8.4 -> 7.0 / 14.5 -> 9.4 us (Qwen3.5)"),
    "small_grid.programs": Choice(
        512, "5f5f05f: tune_decode batch 1: NVFP4 non-flush on 16-row tiles 8.4 -> 7.1 us (Super)"),
    "small_grid.programs_fp32": Choice(
        1024, "253b862: tune_decode batch 1: replay-fp32 window on 8-row tiles 7.9 -> 6.9 us (Nano-4B)"),
    "fused_prep.max_batch": Choice(
        4, "0206003: decode sweep batch 1-4: ring products inside the non-flush launch save a launch"),
    "one_launch.max_batch": Choice(
        4, "a9520aa: tune_decode batch 1: replay-fp32 window 7.1 -> 4.9 us in one launch (Nano-4B)"),
    "one_launch.max_batch_conv": Choice(
        1, "a9520aa: tune_decode: conventional step 5.6 -> 4.8 us at batch 1, 9.7 -> 10.7 us at 4 (Super)"),
    "one_launch.max_state": Choice(
        1 << 21,
        "8ce31a3: tune_decode batch 4, NVFP4 + FP16-SR: two launches 22.8 -> 10.2 us (Nano-4B)"),
    "one_launch.passes_max_batch": Choice(
        8, "4cd8175: tune_decode batch 4 / 8: replay-fp32 window 8.8 -> 6.7 / 12.7 -> 9.6 us (Super)"),
    "one_launch.conventional_counters_need_sr": Choice(
        True, "ae17ae1: tune_decode batch 1-4: FP32 conventional steps 0.1-2.0 us faster without counters"),
    "flush.warps": Choice(
        {True: 8, False: 4},
        "c62468e: tune_decode batch 256: SR flushes spill their Philox words at 4 warps"),
    "flush.dot_precision": Choice(
        "bf16x3", "ecb99e5: tune_decode batch 256: GDN fp32 flush 461 -> 418 us (Qwen3.5-4B)"),
    "verify.maxnreg": Choice(
        168, "9945e4f: tune_decode batch 256: NVFP4 verify 10-12% faster, replay-fp32 0-8%"),
    "verify.cap_min_batch": Choice(
        256, "9945e4f: tune_decode batch 1 / 64: the cap cost 0.9-1.1 us at batch 1"),
    "verify.dot_precision": Choice(
        {"bf16": "bf16x3", "other": "tf32x3"},
        "3e6eecc: tune_decode batch 256: bf16x3 against tf32x3, NVFP4 read copies 1.6-1.7x faster"),
    "pdl": Choice(
        True, "59a0630: tune_decode batch 16-512: replay-fp32 windows 1-12% faster with PDL"),
    # ---------------------------------------------------------------------------- Mamba-2
    "mamba2.block_p_max": Choice(
        {"d_state<=128": 64, "d_state>128": 32},
        "4494625: decode sweep batch 256: head_dim 80 on 32-row tiles, non-flush 355 -> 299 us (Nano-4B)"),
    "mamba2.step_knobs": Choice(
        {"conventional_sr": (8, 2), "conventional_fp32": (16, 1), "conventional_other_warps": 4,
         "replay_warps": 1},
        "f0350d1: tune_decode batch 256: SR conventional on 8 rows / 2 warps 795 -> 596 us (Super)"),
    "mamba2.flush_knobs": Choice(
        {("fp32", False, None): ("dot", 16, 1),
         ("fp32", False, "nvfp4"): ("records", 8, 1),
         ("fp32", False, "fp8e4m3"): ("records", 8, 1),
         ("fp16", True, "nvfp4"): ("records", 16, 2),
         ("fp8e4m3", True, "nvfp4"): ("records", 8, 1),
         ("fp8e4m3", False, None): ("dot", 16, 1),
         ("nvfp4", False, None): ("records", 8, 1)},
        "1f34ef4 / 61cac3e: tune_decode batch 256-512 per (checkpoint, SR, read copy): windows 2.1-2.5% "
        "faster"),
    "mamba2.flush_knobs_other": Choice(
        ("dot", 32), "1f34ef4: tune_decode batch 256: every other config on 32-row dot folds"),
    "mamba2.flush_maxnreg": Choice(
        {("fp16", True, "nvfp4"): 168},
        "61cac3e: tune_decode batch 256-512: windows 2.1-2.5% faster on 16-row two-warp tiles"),
    "mamba2.flush_stages": Choice(
        {"tma": 2, "cp.async": 3},
        "5504ea5 / 3be1d81: tune_decode batch 256: fp32 flush 1219 -> 829 us on 3 stages, 2 with TMA"),
    "mamba2.step_flush_rows": Choice(
        {"records": 8, "dot": 16},
        "4cd8175: tune_decode batch 4 / 8: one-launch flush in row passes, windows 8.8 -> 6.7 us (Super)"),
    "mamba2.passes_need_short_heads": Choice(
        64, "4cd8175: tune_decode batch 4 / 8: SR heads of 80 rows flushed 25.5 -> 49.0 us in passes"),
    "mamba2.whole_head": Choice(
        True, "1a28139: tune_decode batch 16-512: replay-fp32 window 294.3 -> 287.2 us at 256 (Nano-4B)"),
    "mamba2.nonflush_maxnreg": Choice(
        {"cap": 80, "min_batch": 256},
        "3a6b607: tune_decode batch 256-512: NVFP4 whole-head non-flush 1.1-2.2% faster (Nano-4B)"),
    "mamba2.early_loads": Choice(
        True, "3a34feb: tune_decode batch 1 from HBM: replay-fp32 window 5.5 -> 5.3 us (Super)"),
    "mamba2.tile_first": Choice(
        True, "d7f9178: tune_decode batch 256: conventional step 626 -> 590 us tile-first (Super)"),
    "mamba2.nvfp4_decode": Choice(
        "e4m3", "eae4535: tune_decode batch 256: NVFP4 non-flush 90.7 -> 76.3 us (Nano-4B)"),
    "mamba2.fp8_decode": Choice(
        "cvt", "58b53e2: tune_decode batch 1 / 256: words 158.6 against cvt 85.5 us at 256 (Super)"),
    "mamba2.verify_block": Choice(
        (64, 32), "3e6eecc: tune_decode batch 256: head_dim 80 verifies on 32-row tiles (Nano-4B)"),
    # -------------------------------------------------------------------------------- GDN
    "gdn.whole_row_prep_min_batch": Choice(
        256, "3faf01e: tune_decode batch 256 / 512: replay-fp32 window 164.7 -> 163.1 us (Qwen3.5-4B)"),
    "gdn.tile_first": Choice(
        True, "d7f9178: tune_decode batch 256: conventional step 627 -> 584 us tile-first (Qwen3.5-122B)"),
    "gdn.read_copy_flush_min_batch": Choice(
        64, "9198f36: tune_decode batch 8-512: read-copy flush tiles 0.9-16% faster from batch 64"),
    "gdn.flush_knobs": Choice(
        {"recompute_fp8": ("records", 16, 1), "recompute_nvfp4": ("records", 16, 2),
         "recompute_sr": ("records", 16, 4), "recompute_sr_small": ("records", 32, 8),
         "nvfp4_ckpt": ("records", 8, 1), "plain": ("dot", 16, 1), "other_rows": 32},
        "5f5f05f / 9198f36: tune_decode batch 256: NVFP4 + FP16-SR flush 4.4 -> 2.4 ms record by record"),
    "gdn.flush_stages": Choice(
        {"tma_or_fp8": 2, "cp.async": 3},
        "ecb99e5 / 3be1d81: tune_decode batch 256: fp32 flush 416 -> 362 us on 3 stages (Qwen3.5-4B)"),
    "gdn.fp8_decode_words_batches": Choice(
        {"at": 1, "from": 256},
        "58b53e2: tune_decode batch 1 / 256: fp8-read/fp32 window 5.5 -> 5.1 us at 1 (Qwen3.5-4B)"),
    "gdn.nonflush_maxnreg": Choice(
        80, "3a6b607: tune_decode batch 256 / 512: fp8 word-decode non-flush 6.9-9.1% faster"),
    "gdn.flush_maxnreg": Choice(
        {"sr": 64, "nvfp4_over_fp32": 128, "fp8_over_fp32": 168},
        "824e9b1 / 9198f36: tune_decode batch 256 / 512: record-replay flushes 4.9-7.3% faster"),
    "gdn.step_knobs": Choice(
        {"conventional_fp16_sr": (8, 2), "conventional_fp32": (16, 1), "conventional_other": (32, 8),
         "nvfp4": 64, "fp8": 32, "state": 32},
        "f0350d1: tune_decode batch 256: NVFP4 non-flush on 64-row one-warp tiles 168 -> 69 us (Qwen3.5-4B)"),
    "gdn.nvfp4_decode": Choice(
        "words",
        "eae4535: tune_decode batch 256: e4m3 bytes made the non-flush 63.2 -> 70.7 us (Qwen3.5-4B)"),
}
