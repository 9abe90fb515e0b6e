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

Launch choices come from ``plan.mamba2_step_plan`` over the GPU family's table in ``tuning/``;
the knobs and their checks live in ``knobs``, the launch rules in ``tuning/``.
"""

from __future__ import annotations

from ..plan import mamba2_step_plan
from .emulate import mamba2_emulate, mamba2_supported
from .launch import mamba2_decode_step
from .verify import mamba2_commit, mamba2_verify

__all__ = [
    "mamba2_commit",
    "mamba2_decode_step",
    "mamba2_emulate",
    "mamba2_step_plan",
    "mamba2_supported",
    "mamba2_verify",
]
