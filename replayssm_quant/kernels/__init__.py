"""Decode and emulator kernels with device dispatch: CUDA tensors run Triton, other devices
run the pure-torch reference in :mod:`replayssm_quant.ssm`."""

from __future__ import annotations

from .dispatch import emulate_gdn, emulate_mamba2

__all__ = ["emulate_gdn", "emulate_mamba2"]
