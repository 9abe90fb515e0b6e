"""Gated DeltaNet decode kernels: the decode step (``gdn_decode_step``), the speculative verify
and commit, and the whole-sequence emulator.

=============  ==========================================  ================================
module         kernels                                     pure-torch reference (``ssm.gdn``)
=============  ==========================================  ================================
``step``       conventional, ring products, non-flush      ``conventional_step``, ``nonflush_step``
``flush``      persistent flush (u recomputed / UT)        ``flush``
``launch``     ``gdn_decode_step`` (plan, then launch)     ``decode_step``
``verify``     verify, commit                              ``verify``, ``commit``
``emulate``    whole-sequence emulator                     ``emulate``
=============  ==========================================  ================================

Launch choices come from ``plan.gdn_step_plan`` over the GPU family's table in ``tuning/``.
"""

from __future__ import annotations

from ..knobs import GDN_NVFP4_DECODES, GdnKnobs, gdn_nvfp4_decode_of
from ..plan import gdn_step_plan
from ..tuning.gdn_rules import (
    gdn_flush_knobs,
    gdn_flush_maxnreg_default,
    gdn_flush_stages,
    gdn_fp8_decode_default,
    gdn_nonflush_maxnreg_default,
    gdn_prep_groups_default,
    gdn_step_knobs,
    gdn_tile_first,
)
from .emulate import gdn_emulate, gdn_supported
from .launch import gdn_decode_step
from .verify import VERIFY_G_FLOOR, gdn_commit, gdn_verify

__all__ = [
    "GDN_NVFP4_DECODES",
    "GdnKnobs",
    "VERIFY_G_FLOOR",
    "gdn_commit",
    "gdn_decode_step",
    "gdn_emulate",
    "gdn_flush_knobs",
    "gdn_flush_maxnreg_default",
    "gdn_flush_stages",
    "gdn_fp8_decode_default",
    "gdn_nonflush_maxnreg_default",
    "gdn_nvfp4_decode_of",
    "gdn_prep_groups_default",
    "gdn_step_knobs",
    "gdn_step_plan",
    "gdn_supported",
    "gdn_tile_first",
    "gdn_verify",
]
