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

Launch choices come from ``plan.gdn_step_plan`` over the GPU family's table in ``tuning/``;
the knobs and their checks live in ``knobs``, the launch rules in ``tuning/``.
"""

from __future__ import annotations

from ..plan import gdn_step_plan
from .emulate import gdn_emulate, gdn_supported
from .launch import gdn_decode_step
from .verify import VERIFY_G_FLOOR, gdn_commit, gdn_verify

__all__ = [
    "VERIFY_G_FLOOR",
    "gdn_commit",
    "gdn_decode_step",
    "gdn_emulate",
    "gdn_step_plan",
    "gdn_supported",
    "gdn_verify",
]
