"""Device dispatch for the public kernel entry points: CUDA tensors run the Triton emulator
kernels (one launch per layer and sequence batch), everything else runs the pure-torch
reference. Shapes or configs the kernels do not cover (d_state / d_k not a power of two,
``L`` above :data:`~replayssm_quant.kernels.core.emulation.MAX_KERNEL_L`) also run the reference, so a
caller never has to check."""

from __future__ import annotations

import torch

from ..precision import PrecisionConfig, parse_config


def _use_triton(t: object) -> bool:
    return isinstance(t, torch.Tensor) and t.is_cuda


def emulate_mamba2(cfg: PrecisionConfig | str, S0, x, dt, A, Bm, C, D, *, layer: int = 0,
                   seed: int = 0, sequence=None, act_dtype=torch.float32):
    """Whole-sequence Mamba-2 decode emulation (see ``ssm.mamba2.emulate``)."""
    from ..ssm import mamba2

    cfg = parse_config(cfg)
    if _use_triton(x) and isinstance(Bm, torch.Tensor) and Bm.dim() == 4:
        from .mamba2.emulate import mamba2_emulate, mamba2_supported

        if mamba2_supported(cfg, int(Bm.shape[-1])):
            return mamba2_emulate(cfg, S0, x, dt, A, Bm, C, D, layer=layer, seed=seed,
                                  sequence=sequence, act_dtype=act_dtype)
    return mamba2.emulate(cfg, S0, x, dt, A, Bm, C, D, layer=layer, seed=seed,
                          sequence=sequence, act_dtype=act_dtype)


def emulate_gdn(cfg: PrecisionConfig | str, S0, q, k, v, g, beta, *, layer: int = 0,
                seed: int = 0, sequence=None, act_dtype=torch.float32):
    """Whole-sequence GDN decode emulation (see ``ssm.gdn.emulate``)."""
    from ..ssm import gdn

    cfg = parse_config(cfg)
    if _use_triton(k) and k.dim() == 4:
        from .gdn.emulate import gdn_emulate, gdn_supported

        if gdn_supported(cfg, int(k.shape[-1])):
            return gdn_emulate(cfg, S0, q, k, v, g, beta, layer=layer, seed=seed,
                               sequence=sequence, act_dtype=act_dtype)
    return gdn.emulate(cfg, S0, q, k, v, g, beta, layer=layer, seed=seed, sequence=sequence,
                       act_dtype=act_dtype)
