"""Device dispatch for the public kernel entry points."""

from __future__ import annotations

import torch

from ..precision import PrecisionConfig


def _use_triton(t: torch.Tensor) -> bool:
    return t.is_cuda


def emulate_mamba2(cfg: PrecisionConfig, S0, x, dt, A, Bm, C, D, *, layer: int = 0,
                   seed: int = 0, sequence=None, act_dtype=torch.float32):
    """Whole-sequence Mamba-2 decode emulation (see ``ssm.mamba2.emulate``)."""
    from ..ssm import mamba2

    return mamba2.emulate(cfg, S0, x, dt, A, Bm, C, D, layer=layer, seed=seed,
                          sequence=sequence, act_dtype=act_dtype)


def emulate_gdn(cfg: PrecisionConfig, S0, q, k, v, g, beta, *, layer: int = 0, seed: int = 0,
                sequence=None, act_dtype=torch.float32):
    """Whole-sequence GDN decode emulation (see ``ssm.gdn.emulate``)."""
    from ..ssm import gdn

    return gdn.emulate(cfg, S0, q, k, v, g, beta, layer=layer, seed=seed, sequence=sequence,
                       act_dtype=act_dtype)
