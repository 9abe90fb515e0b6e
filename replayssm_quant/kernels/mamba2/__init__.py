"""Mamba-2 decode kernels: the decode step (``mamba2_decode_step``: conventional, or ReplaySSM
non-flush / flush per row), the speculative verify and commit, and the whole-sequence emulator.

=============  ==========================================  ===================================
module         kernels                                     pure-torch reference (``ssm.mamba2``)
=============  ==========================================  ===================================
``step``       conventional, ring products, non-flush      ``conventional_step``, ``nonflush_step``
``flush``      persistent flush                            ``flush``
``launch``     ``mamba2_decode_step`` (plan, then launch)  ``decode_step``
``verify``     verify, commit                              ``verify``, ``commit``
``emulate``    whole-sequence emulator                     ``emulate``
=============  ==========================================  ===================================

Launch choices come from ``plan.mamba2_step_plan`` over the GPU family's table in ``tuning/``.
The names re-exported below beyond the public API are the launch rules and knob checks that
were importable from here before the kernels were cut by op.
"""

from __future__ import annotations

from ..core.emulation import MAX_KERNEL_L
from ..core.ring import advance_cursor, advance_rows, finish_row, flush_list, shift_and_commit
from ..knobs import (
    DOT_PRECISIONS,
    FLUSH_FOLDS,
    FOLD_PRECISIONS,
    FP8_DECODES,
    NVFP4_DECODES,
    PDL_EDGES,
    Mamba2Knobs,
    check_prep_groups,
    check_step_flush,
    fold_precision,
    fp8_decode_of,
    pdl_edges_of,
    resolve_pdl,
    split_terms,
    verify_chunk,
    verify_precision,
)
from ..plan import mamba2_step_plan
from ..tuning.mamba2_rules import (
    early_loads_default,
    flush_passes_default,
    flush_stages_for,
    mamba2_flush_knobs,
    mamba2_flush_maxnreg_default,
    mamba2_nonflush_maxnreg_default,
    mamba2_step_knobs,
    mamba2_tile_first,
    step_flush_default,
    verify_block,
    whole_head_default,
    whole_head_rows,
)
from ..tuning.rules import (
    default_fold_precision,
    fused_prep_default,
    keeps_counters,
    one_launch_default,
    prep_groups_default,
    reads_narrow_copy,
    resolve_one_launch,
    small_grid_rows,
    verify_maxnreg_default,
)
from .emulate import mamba2_emulate, mamba2_supported
from .launch import mamba2_decode_step
from .verify import mamba2_commit, mamba2_verify

__all__ = [
    "DOT_PRECISIONS",
    "FLUSH_FOLDS",
    "FOLD_PRECISIONS",
    "FP8_DECODES",
    "MAX_KERNEL_L",
    "Mamba2Knobs",
    "NVFP4_DECODES",
    "PDL_EDGES",
    "advance_cursor",
    "advance_rows",
    "check_prep_groups",
    "check_step_flush",
    "default_fold_precision",
    "early_loads_default",
    "finish_row",
    "flush_list",
    "flush_passes_default",
    "flush_stages_for",
    "fold_precision",
    "fp8_decode_of",
    "fused_prep_default",
    "keeps_counters",
    "mamba2_commit",
    "mamba2_decode_step",
    "mamba2_emulate",
    "mamba2_flush_knobs",
    "mamba2_flush_maxnreg_default",
    "mamba2_nonflush_maxnreg_default",
    "mamba2_step_knobs",
    "mamba2_step_plan",
    "mamba2_supported",
    "mamba2_tile_first",
    "mamba2_verify",
    "one_launch_default",
    "pdl_edges_of",
    "prep_groups_default",
    "reads_narrow_copy",
    "resolve_one_launch",
    "resolve_pdl",
    "shift_and_commit",
    "small_grid_rows",
    "split_terms",
    "step_flush_default",
    "verify_block",
    "verify_chunk",
    "verify_maxnreg_default",
    "verify_precision",
    "whole_head_default",
    "whole_head_rows",
]
