"""Default launch choices of the GDN decode kernels, as rules over the GPU family's tuning table
(each takes the ``table`` of its target, ``tuning.table_for``).
"""

from __future__ import annotations

import triton

from . import DEFAULT_TABLE, Table
from .rules import flush_warps_default, prep_groups_default, reads_narrow_copy


def gdn_prep_groups_default(cfg, batch: int, key_heads: int, *,
                            table: Table = DEFAULT_TABLE) -> int:
    """Key heads per GDN ring-products program: every key head of a row in one program (the
    largest power of two dividing the key heads) for a step that reads an fp32 (not fp8 /
    NVFP4) state at batch >= ``gdn.whole_row_prep_min_batch``, else
    ``rules.prep_groups_default``. The non-flush launch starts (programmatic launch) once every
    products program has started, so fewer programs start it sooner; narrow reads, bound by
    instruction issue, gain nothing.
    Evidence: ``tuning.hopper`` entry ``gdn.whole_row_prep_min_batch``."""
    if batch >= table["gdn.whole_row_prep_min_batch"].value and not reads_narrow_copy(cfg):
        return key_heads & -key_heads
    return prep_groups_default(batch, key_heads, table=table)


def gdn_tile_first(capacity: int, narrow: bool = True, *, table: Table = DEFAULT_TABLE) -> bool:
    """Default grid order (``tile_first``) of the GDN conventional / non-flush step: (tiles,
    heads, rows) for the conventional step (``gdn.tile_first``) and for the one-warp non-flush
    step that reads the state itself rather than an fp8 / NVFP4 copy (``narrow``); (rows,
    heads, tiles) for the narrow reads. Evidence: ``tuning.hopper`` entry ``gdn.tile_first``."""
    if capacity == 0:
        return table["gdn.tile_first"].value
    return not narrow


def gdn_flush_knobs(cfg, batch: int = 256, *, table: Table = DEFAULT_TABLE) -> tuple[str, int, int]:
    """(flush_fold, value rows, warps) defaults of the GDN flush at ``batch`` rows
    (``gdn.flush_knobs``). Where the flush recomputes u (a narrow read copy), ``"records"``
    replays the window from the checkpoint record by record (the UT transform's products
    spilled): 16 rows, on one warp for an fp8 copy of an fp32 checkpoint, two for an NVFP4
    copy, and for an SR checkpoint's copies four from ``gdn.read_copy_flush_min_batch`` (32
    rows on eight below it). Otherwise the NVFP4 checkpoint folds record by record on 8 rows,
    a checkpoint without SR (fp32, fp8) takes the ``"dot"`` fold on one-warp 16-row tiles, and
    the rest 32 rows and ``flush_warps_default`` warps.
    Evidence: ``tuning.hopper`` entries ``gdn.flush_knobs``, ``gdn.read_copy_flush_min_batch``."""
    knobs = table["gdn.flush_knobs"].value
    if cfg.recompute_u:
        if not cfg.uses_sr:  # fp8 / NVFP4 copy of an fp32 checkpoint
            return knobs["recompute_nvfp4" if cfg.read.name == "nvfp4" else "recompute_fp8"]
        return knobs["recompute_sr" if batch >= table["gdn.read_copy_flush_min_batch"].value
                     else "recompute_sr_small"]
    if cfg.ckpt.name == "nvfp4" and not cfg.uses_sr:
        return knobs["nvfp4_ckpt"]
    if not cfg.uses_sr:  # fp32 or fp8 checkpoint (bf16x3 products on a bf16 ring)
        return knobs["plain"]
    return "dot", knobs["other_rows"], flush_warps_default(cfg, table=table)


def gdn_flush_stages(precision: str, records: bool, cfg=None, tma: bool = False, *,
                     table: Table = DEFAULT_TABLE) -> int | None:
    """Software-pipelining stages of the persistent GDN flush loop with the tensor-core
    ``"bf16x3"`` dot fold: 3 for an fp32 checkpoint loaded with cp.async, 2 for one loaded
    through TMA (``resolve_flush_tma``) and for an fp8 checkpoint; None (Triton's choice)
    otherwise. Evidence: ``tuning.hopper`` entry ``gdn.flush_stages``."""
    if precision != "bf16x3" or records:
        return None
    stages = table["gdn.flush_stages"].value
    return stages["tma_or_fp8" if tma or (cfg is not None and cfg.ckpt.name.startswith("fp8"))
                  else "cp.async"]


def gdn_fp8_decode_default(batch: int, *, table: Table = DEFAULT_TABLE) -> str:
    """``fp8_decode`` of a GDN step that reads an fp8 source: ``"words"`` at batch 1 and from
    batch 256, ``"cvt"`` between (where words were slower).
    Evidence: ``tuning.hopper`` entry ``gdn.fp8_decode_words_batches``."""
    words = table["gdn.fp8_decode_words_batches"].value
    return "words" if batch == words["at"] or batch >= words["from"] else "cvt"


def gdn_nonflush_maxnreg_default(decode: str, rows: int, warps: int, default_rows: int,
                                 default_warps: int, fused: bool, *,
                                 table: Table = DEFAULT_TABLE) -> int | None:
    """The register cap of a GDN non-flush program left at its default ``maxnreg``: 80 for an
    fp8 source decoded from int32 words (``fp8_decode="words"``) on its default one-warp 32-row
    tiles, in a step of separate launches (no spills; 24 programs per SM instead of 20). Elsewhere
    None: the byte-tile and NVFP4 decodes spill at 80, and a fused step holds more.
    Evidence: ``tuning.hopper`` entry ``gdn.nonflush_maxnreg``."""
    if (decode == "words8" and rows == default_rows and warps == default_warps == 1
            and not fused):
        return table["gdn.nonflush_maxnreg"].value
    return None


def gdn_flush_maxnreg_default(cfg, records: bool, rows: int, warps: int, batch: int, *,
                              table: Table = DEFAULT_TABLE) -> int | None:
    """The register cap of a GDN flush program left at its default ``flush_maxnreg``, where
    the flush replays the window record by record on its default tiles at ``batch``
    (``gdn_flush_knobs``): 64 for an SR checkpoint's copies and 168 for an fp8 copy of an fp32
    checkpoint, both from ``gdn.read_copy_flush_min_batch``; 128 for an NVFP4 copy of an fp32
    checkpoint. Elsewhere None (the NVFP4 checkpoint's flush ran slower capped).
    Evidence: ``tuning.hopper`` entry ``gdn.flush_maxnreg``."""
    if not (records and cfg.recompute_u):
        return None
    if (rows, warps) != gdn_flush_knobs(cfg, batch, table=table)[1:]:
        return None
    caps = table["gdn.flush_maxnreg"].value
    if cfg.read.name == "nvfp4" and not cfg.uses_sr:
        return caps["nvfp4_over_fp32"]
    if batch < table["gdn.read_copy_flush_min_batch"].value:
        return None
    return caps["sr"] if cfg.uses_sr else (caps["fp8_over_fp32"] if cfg.read.name.startswith("fp8")
                                           else None)


def gdn_step_knobs(cfg, V: int, *, table: Table = DEFAULT_TABLE) -> tuple[int, int]:
    """(value rows, warps) per program of the conventional / non-flush step: conventional 32
    rows / 8 warps, 8 / 2 with fp16 SR, 16 / 1 for an fp32 state; non-flush 32 rows / 1 warp,
    64 rows / 1 warp reading an NVFP4 copy, 32 rows / 1 warp reading an fp8 one (at 64 rows its
    two row products spill). Evidence: ``tuning.hopper`` entry ``gdn.step_knobs``."""
    knobs = table["gdn.step_knobs"].value
    vp = triton.next_power_of_2(V)
    if cfg.L == 1:
        if cfg.uses_sr and cfg.ckpt.name == "fp16":
            rows, warps = knobs["conventional_fp16_sr"]
        elif cfg.ckpt.name == "fp32":
            rows, warps = knobs["conventional_fp32"]
        else:
            rows, warps = knobs["conventional_other"]
        return min(vp, rows), warps
    if reads_narrow_copy(cfg):
        return min(vp, knobs["fp8" if (cfg.read or cfg.ckpt).name.startswith("fp8") else "nvfp4"]), 1
    return min(vp, knobs["state"]), 1
