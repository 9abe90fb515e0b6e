"""Default launch choices of the Mamba-2 decode and verify kernels, as rules over the GPU
family's tuning table (each takes the ``table`` of its target, ``tuning.table_for``).
"""

from __future__ import annotations

import torch
import triton

from . import DEFAULT_TABLE, Table
from .rules import flush_warps_default, reads_narrow_copy


def tile_rows_max(N: int, *, table: Table = DEFAULT_TABLE) -> int:
    """The most head-dim rows a non-flush program holds for d_state ``N``: 64, 32 when
    d_state > 128. Evidence: ``tuning.hopper`` entry ``mamba2.block_p_max``."""
    return table["mamba2.block_p_max"].value["d_state<=128" if N <= 128 else "d_state>128"]


def block_p_default(P: int, N: int, *, table: Table = DEFAULT_TABLE) -> int:
    """Head-dim rows per decode program: the largest power of two up to ``tile_rows_max``
    whose tiles pad P by at most a quarter; Nemotron-3-Nano's head_dim 80 takes 32 (96 rows)
    rather than 64 (128 rows). Evidence: ``tuning.hopper`` entry ``mamba2.block_p_max``."""
    b = min(triton.next_power_of_2(P), tile_rows_max(N, table=table))
    while b > 16 and triton.cdiv(P, b) * b * 4 > P * 5:
        b //= 2
    return b


def flush_passes_default(cfg, P: int, *, table: Table = DEFAULT_TABLE) -> bool:
    """Whether a Mamba-2 ReplaySSM step's one-launch programs, where they would flush in row
    passes (``step_flush_default``: more than 16 rows), make the step one launch up to
    ``one_launch.passes_max_batch``: every config except an SR checkpoint on heads of more than
    ``mamba2.passes_need_short_heads`` (64) rows, whose whole-head programs flush as one long
    chain. Evidence: ``tuning.hopper`` entry ``mamba2.passes_need_short_heads``."""
    return not (cfg.uses_sr and P > table["mamba2.passes_need_short_heads"].value)


def step_flush_default(cfg, BP: int, BP2: int, ring_dtype: torch.dtype, *,
                       table: Table = DEFAULT_TABLE) -> tuple[int | None, str | None]:
    """(``step_flush_rows``, ``step_flush_fold``) of a one-launch step left at their defaults:
    a program of more rows than one pass flushes them in passes, a plain fp32 checkpoint (no
    read copy, bf16 ring) on passes of the entry's ``"dot"`` rows (16) folded as one bf16x3
    product, every other config on passes of its ``"records"`` rows (8) folded record by
    record; a program of 16 rows or fewer flushes them at once.
    Evidence: ``tuning.hopper`` entry ``mamba2.step_flush_rows``."""
    pass_rows = table["mamba2.step_flush_rows"].value
    rows = BP + BP2
    plain = cfg.read is None and cfg.ckpt.name == "fp32" and ring_dtype == torch.bfloat16
    fr = pass_rows["dot"] if plain else pass_rows["records"]
    if rows <= pass_rows["dot"] or BP % fr or BP2 % fr:
        return None, None
    return fr, "dot" if plain else "records"


def mamba2_tile_first(capacity: int, P: int, block_p: int, narrow: bool = True, *,
                      table: Table = DEFAULT_TABLE) -> bool:
    """Default grid order of the conventional / non-flush step (``tile_first``,
    ``core.memory.row_head_tile``): (tiles, heads, rows) for the conventional step
    (``mamba2.tile_first``: its programs then read and write one slot's state in order), for
    non-flush steps whose heads take more than one tile and for non-flush steps that read the
    state itself rather than an fp8 / NVFP4 copy (``narrow``); (rows, heads, tiles) otherwise.
    A whole-head grid orders heads first for the state itself and rows first for a narrow copy
    (``plan.mamba2_step_plan``). Evidence: ``tuning.hopper`` entry ``mamba2.tile_first``."""
    if capacity == 0:
        return table["mamba2.tile_first"].value
    return triton.cdiv(P, block_p) > 1 or not narrow


def flush_stages_for(cfg, tma: bool = False, *, table: Table = DEFAULT_TABLE) -> int | None:
    """Software-pipelining stages of the persistent Mamba-2 flush loop: for a plain fp32
    checkpoint, whose flush is bound by load latency, 3 with cp.async loads and 2 with TMA loads
    (``resolve_flush_tma``); otherwise None, Triton's own choice.
    Evidence: ``tuning.hopper`` entry ``mamba2.flush_stages``."""
    if cfg.ckpt.name == "fp32" and cfg.read is None:
        return table["mamba2.flush_stages"].value["tma" if tma else "cp.async"]
    return None


def whole_head_rows(P: int, N: int, *, table: Table = DEFAULT_TABLE) -> tuple[int, int] | None:
    """Two power-of-two row passes ``(BP, BP2)`` that cover a head dim ``P`` that is no power of
    two with as little padding as two passes allow (Nemotron-3-Nano's 80: 64 + 16), or None
    when ``P`` is one tile already or the first pass would exceed ``tile_rows_max``."""
    cap = tile_rows_max(N, table=table)
    bp = 1 << (P.bit_length() - 1)
    if bp == P or bp > cap or P - bp > bp:
        return None
    return bp, triton.next_power_of_2(P - bp)


def mamba2_nonflush_maxnreg_default(decode: str, rows2: int, warps: int, default_warps: int,
                                    fused: bool, batch: int, *,
                                    table: Table = DEFAULT_TABLE) -> int | None:
    """The register cap of a Mamba-2 non-flush program left at its default ``maxnreg``: 80
    from batch 256 for a whole-head program of two passes that decodes an NVFP4 source through
    E4M3 bytes on its default one warp (no spills; 24 programs per SM instead of 20, see
    ``core.persistent.programs_per_sm``). Elsewhere None: other programs spill or lose
    occupancy under the cap. Evidence: ``tuning.hopper`` entry ``mamba2.nonflush_maxnreg``."""
    cap = table["mamba2.nonflush_maxnreg"].value
    if (decode == "e4m3" and rows2 > 0 and warps == default_warps == 1 and not fused
            and batch >= cap["min_batch"]):
        return cap["cap"]
    return None


def whole_head_default(cfg, one_launch: bool = False, passes: bool = False, *,
                       table: Table = DEFAULT_TABLE) -> bool:
    """Whether a non-flush step covers each head in one program (``whole_head``) by default:
    steps reading an fp8 / NVFP4 copy, which are bound by instruction issue, so padding rows and
    a second program per head cost time; steps reading an fp32 state except one-launch steps;
    and one-launch steps whose programs flush in row passes (``passes``).
    Evidence: ``tuning.hopper`` entry ``mamba2.whole_head``."""
    return (table["mamba2.whole_head"].value and cfg.L > 1
            and (reads_narrow_copy(cfg) or not one_launch or passes))


def early_loads_default(cfg, batch: int, one_launch: bool, *,
                        table: Table = DEFAULT_TABLE) -> bool:
    """Whether a Mamba-2 non-flush step issues its output's loads before its cursor arrives
    (``early_loads``) by default: a one-launch step at batch 1 that reads an fp32 state, where
    the loads of the state, the ring and the cursor then overlap. A step reading an fp8 / NVFP4
    copy keeps its loads after the cursor (its flush steps took longer).
    Evidence: ``tuning.hopper`` entry ``mamba2.early_loads``."""
    return (table["mamba2.early_loads"].value and one_launch and batch == 1
            and (cfg.read or cfg.ckpt).name == "fp32")


def mamba2_step_knobs(cfg, P: int, N: int, *, table: Table = DEFAULT_TABLE) -> tuple[int, int]:
    """(head-dim rows, warps) per program of the conventional / non-flush step: a conventional
    step with SR on 8 rows and 2 warps (Philox and the rounding are the work), one of an fp32
    state on 16 rows and one warp, other conventional steps on ``block_p_default`` rows and 4
    warps; non-flush steps on ``block_p_default`` rows and one warp (a narrow copy's step is
    bound by instruction issue, not bytes). Evidence: ``tuning.hopper`` entry ``mamba2.step_knobs``."""
    knobs = table["mamba2.step_knobs"].value
    bp = block_p_default(P, N, table=table)
    if cfg.L == 1:
        if cfg.uses_sr or cfg.ckpt.name == "fp32":
            rows, warps = knobs["conventional_sr" if cfg.uses_sr else "conventional_fp32"]
            return min(rows, triton.next_power_of_2(P)), warps
        return bp, knobs["conventional_other_warps"]
    return bp, knobs["replay_warps"]


def flush_key(cfg) -> tuple[str, bool, str | None]:
    """The key of ``mamba2.flush_knobs`` / ``mamba2.flush_maxnreg``: (checkpoint format, SR,
    read-copy format)."""
    return (cfg.ckpt.name, cfg.uses_sr, cfg.read.name if cfg.read is not None else None)


def mamba2_flush_knobs(cfg, *, table: Table = DEFAULT_TABLE) -> tuple[str, int, int]:
    """(flush_fold, flush tile rows, flush warps) defaults for a config: ``mamba2.flush_knobs``
    by ``flush_key``; other configs ``mamba2.flush_knobs_other`` on ``flush_warps_default``.
    Evidence: ``tuning.hopper`` entries ``mamba2.flush_knobs``, ``mamba2.flush_knobs_other``."""
    return table["mamba2.flush_knobs"].value.get(
        flush_key(cfg), (*table["mamba2.flush_knobs_other"].value,
                         flush_warps_default(cfg, table=table)))


def mamba2_flush_maxnreg_default(cfg, rows: int, warps: int, *,
                                 table: Table = DEFAULT_TABLE) -> int | None:
    """The register cap of a Mamba-2 flush program left at its default ``flush_maxnreg``, on
    its default tiles (``mamba2_flush_knobs``; other tiles take no cap): ``mamba2.flush_maxnreg``
    by ``flush_key`` (168 for the NVFP4 copy of an fp16-SR checkpoint, 6 programs per SM instead
    of 4 with a few spills). Evidence: ``tuning.hopper`` entry ``mamba2.flush_maxnreg``."""
    cap = table["mamba2.flush_maxnreg"].value.get(flush_key(cfg))
    return (cap if cap is not None and (rows, warps) == mamba2_flush_knobs(cfg, table=table)[1:]
            else None)


def verify_block(P: int, *, table: Table = DEFAULT_TABLE) -> int:
    """Head-dim rows per verify program: 64 or 32, whichever pads P least (64 on a tie);
    Nemotron-3-Nano-4B's 80 rows take 32. Evidence: ``tuning.hopper`` entry ``mamba2.verify_block``."""
    return min(table["mamba2.verify_block"].value, key=lambda b: (triton.cdiv(P, b) * b, -b))
