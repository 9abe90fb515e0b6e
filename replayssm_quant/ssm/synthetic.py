"""Random SSM-layer inputs with realistic scales, for tests, benchmarks and simulations.

Scales follow the models' own initialisation: Mamba-2 draws ``dt`` log-uniformly in
``[1e-3, 1e-1]`` and ``A = -uniform(1, 16)``; GDN decays sit in ``[0.9, 0.9999]`` per token,
``beta = sigmoid(normal)`` and ``q``/``k`` are unit vectors. Long-memory heads are a
``dt_range``/``A_range`` (or ``decay_range``) away.
"""

from __future__ import annotations

import math

import torch

__all__ = ["gdn_inputs", "mamba2_inputs"]


def _uniform(shape: tuple[int, ...], lo: float, hi: float, gen: torch.Generator | None,
             device: torch.device | str | None) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(shape, generator=gen, device=device)


def mamba2_inputs(
    batch: int,
    steps: int,
    num_heads: int,
    head_dim: int,
    d_state: int,
    n_groups: int = 1,
    *,
    dt_range: tuple[float, float] = (1e-3, 1e-1),
    A_range: tuple[float, float] = (-16.0, -1.0),
    with_D: bool = True,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> dict[str, torch.Tensor | None]:
    """Keyword arguments for ``mamba2.emulate``: ``x (B, T, H, P)``, ``dt (B, T, H)`` fp32
    (already softplus'd), ``A (H,)``, ``Bm``/``C (B, T, G, N)``, ``D (H,)`` or None."""
    g = generator
    x = torch.randn(batch, steps, num_heads, head_dim, generator=g, device=device)
    dt = torch.exp(_uniform((batch, steps, num_heads), math.log(dt_range[0]),
                            math.log(dt_range[1]), g, device))
    A = _uniform((num_heads,), A_range[0], A_range[1], g, device)
    Bm = torch.randn(batch, steps, n_groups, d_state, generator=g, device=device)
    C = torch.randn(batch, steps, n_groups, d_state, generator=g, device=device)
    D = torch.randn(num_heads, generator=g, device=device) if with_D else None
    return dict(x=x, dt=dt, A=A, Bm=Bm, C=C, D=D)


def gdn_inputs(
    batch: int,
    steps: int,
    num_v_heads: int,
    head_v_dim: int,
    head_k_dim: int,
    num_k_heads: int | None = None,
    *,
    decay_range: tuple[float, float] = (0.9, 0.9999),
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> dict[str, torch.Tensor]:
    """Keyword arguments for ``gdn.emulate``: unit-norm ``q``, ``k (B, T, Hk, K)``,
    ``v (B, T, Hv, V)``, ``g = log(decay)`` and ``beta`` in (0, 1), both ``(B, T, Hv)``."""
    gen = generator
    hk = num_v_heads if num_k_heads is None else num_k_heads

    def unit(*shape: int) -> torch.Tensor:
        return torch.nn.functional.normalize(
            torch.randn(*shape, generator=gen, device=device), dim=-1)

    q = unit(batch, steps, hk, head_k_dim)
    k = unit(batch, steps, hk, head_k_dim)
    v = torch.randn(batch, steps, num_v_heads, head_v_dim, generator=gen, device=device)
    decay = _uniform((batch, steps, num_v_heads), decay_range[0], decay_range[1], gen, device)
    beta = torch.sigmoid(torch.randn(batch, steps, num_v_heads, generator=gen, device=device))
    return dict(q=q, k=k, v=v, g=torch.log(decay), beta=beta)
