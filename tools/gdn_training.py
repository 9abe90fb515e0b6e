"""Which kernel trains Qwen3.5's Gated DeltaNet layers in ``train_probes.py``.

Transformers runs a GDN layer through the module-level functions
``modeling_qwen3_5.torch_chunk_gated_delta_rule`` (prompt, training) and
``torch_recurrent_gated_delta_rule`` (one-token decode); with ``fla`` installed they resolve to
FLA's Triton kernels, otherwise to pure-torch references that are an order of magnitude
slower. FLA refuses the gated backward on Hopper with Triton in [3.4.0, 3.7.1): Triton
miscompiles ``chunk_bwd_kernel_dqkwg`` at a key block of 64 (fla-org/flash-linear-attention
#640), and ``prepare_wy_repr_bwd`` is reported wrong at chunk 64 on the same range (#984).
:func:`use_fla` lifts that guard only after comparing FLA's output and every input gradient
with transformers' reference at the fixture's head shapes on the device itself, and falls back
to the reference when they differ; :func:`compile_reference` compiles the reference instead.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
import torch.nn.functional as F

GRAD_TOLERANCE = 0.05
"""Largest relative error (norm of the difference / norm of the reference) FLA may show in the
output or any gradient, fp32 inputs; the miscompile gives ~0.5, tf32 rounding ~1e-3."""

_NAMES = ("output", "dq", "dk", "dv", "dg", "dbeta")


def _qwen_module():
    from transformers.models.qwen3_5 import modeling_qwen3_5

    return modeling_qwen3_5


def reference_functions() -> tuple[Callable, Callable]:
    """Transformers' pure-torch chunked and recurrent GDN (unwrapped from whatever kernel
    transformers resolved them to)."""
    mq = _qwen_module()
    return (inspect.unwrap(mq.torch_chunk_gated_delta_rule),
            inspect.unwrap(mq.torch_recurrent_gated_delta_rule))


def _keyword_filtered(fn: Callable) -> Callable:
    """``fn`` called with only the keywords it names (transformers passes attention kwargs)."""
    names = {n for n, p in inspect.signature(fn).parameters.items() if p.kind is not p.VAR_KEYWORD}

    def call(*args, **kwargs):
        return fn(*args, **{k: v for k, v in kwargs.items() if k in names})

    call.__wrapped__ = fn
    return call


def grad_errors(fn: Callable, reference: Callable, device, *, batch: int = 2, length: int = 1024,
                heads: int = 8, dk: int = 32, dv: int = 32, seed: int = 0,
                dtype: torch.dtype = torch.float32) -> dict[str, float]:
    """Relative error of ``fn``'s output and input gradients against ``reference`` (fp32) on
    fresh random inputs of the given shape (q, k, v normal, L2-normalised in the kernel; log
    decays in (-2.5, 0); betas in (0, 1)); ``dtype`` is what ``fn`` gets for q, k, v, beta."""
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(batch, length, heads, dk, generator=gen) for _ in range(2))
    v = torch.randn(batch, length, heads, dv, generator=gen)
    g = -F.softplus(torch.randn(batch, length, heads, generator=gen))
    beta = torch.rand(batch, length, heads, generator=gen)
    grad_out = torch.randn(batch, length, heads, dv, generator=gen)

    def run(f: Callable, dt: torch.dtype) -> list[torch.Tensor]:
        xs = [x.to(device, dt, copy=True).requires_grad_() for x in (q, k, v)]
        gg = g.to(device, torch.float32, copy=True).requires_grad_()
        bb = beta.to(device, dt, copy=True).requires_grad_()
        out = f(xs[0], xs[1], xs[2], g=gg, beta=bb, use_qk_l2norm_in_kernel=True)[0]
        (out.float() * grad_out.to(device)).sum().backward()
        grads = (out, xs[0].grad, xs[1].grad, xs[2].grad, gg.grad, bb.grad)
        return [t.detach().float().clone() for t in grads]

    want = run(reference, torch.float32)
    got = run(fn, dtype)
    return {n: ((a - b).norm() / b.norm().clamp(min=1e-30)).item()
            for n, a, b in zip(_NAMES, got, want, strict=True)}


def use_reference() -> str:
    """Route transformers' GDN functions to its pure-torch references."""
    mq = _qwen_module()
    mq.torch_chunk_gated_delta_rule, mq.torch_recurrent_gated_delta_rule = reference_functions()
    return "transformers' torch reference"


def use_fla(device, log: Callable[[str], None], **shapes) -> str | None:
    """Route transformers' GDN functions to FLA's kernels when FLA is installed and its output
    and gradients match the reference at ``shapes`` (see :func:`grad_errors`); otherwise route
    them to the reference. What was used (for the run record) when FLA is, else None."""
    mq = _qwen_module()
    chunk_ref = reference_functions()[0]
    try:
        import fla.ops.common.chunk_o as chunk_o
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    except ImportError as exc:
        log(f"FLA not importable ({exc}); GDN trains through transformers' torch reference")
        use_reference()
        return None
    guard = getattr(chunk_o, "TRITON_ABOVE_3_7_1", True)
    chunk_o.TRITON_ABOVE_3_7_1 = True  # checked right below, on this device and these shapes
    fla_chunk = _keyword_filtered(chunk_gated_delta_rule)
    errors = {f"fp32 {k}": v for k, v in grad_errors(fla_chunk, chunk_ref, device, **shapes).items()}
    errors.update({f"bf16 {k}": v for k, v in
                   grad_errors(fla_chunk, chunk_ref, device, dtype=torch.bfloat16, **shapes).items()})
    worst = max(v for k, v in errors.items() if k.startswith("fp32"))
    log("FLA GDN vs torch reference, relative error: "
        + ", ".join(f"{k} {v:.1e}" for k, v in errors.items()))
    if not worst < GRAD_TOLERANCE:  # NaN fails too
        chunk_o.TRITON_ABOVE_3_7_1 = guard
        log(f"FLA GDN differs from the reference ({worst:.2e} >= {GRAD_TOLERANCE}); using the reference")
        use_reference()
        return None
    mq.torch_chunk_gated_delta_rule = fla_chunk
    mq.torch_recurrent_gated_delta_rule = _keyword_filtered(fused_recurrent_gated_delta_rule)
    import fla

    return (f"FLA {fla.__version__} (output and gradients within {worst:.1e} of transformers' "
            "torch reference, fp32, checked on the device)")


def compile_reference(log: Callable[[str], None]) -> str:
    """Train through ``torch.compile`` of transformers' chunked reference, for the training
    shapes only (grad enabled); generation and validation stay eager; any compile failure falls
    back to eager for good."""
    mq = _qwen_module()
    eager, recurrent = reference_functions()
    mq.torch_recurrent_gated_delta_rule = recurrent
    compiled = torch.compile(eager, dynamic=False)
    state = {"ok": True}

    def chunk(*a, **kw):
        if state["ok"] and torch.is_grad_enabled():
            try:
                return compiled(*a, **kw)
            except Exception as exc:  # noqa: BLE001 - any compiler failure means eager
                state["ok"] = False
                log(f"torch.compile of the GDN chunk failed ({type(exc).__name__}); eager from now")
        return eager(*a, **kw)

    mq.torch_chunk_gated_delta_rule = chunk
    return "torch.compile of transformers' torch reference"
