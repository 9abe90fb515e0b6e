"""Routes vLLM 0.33's SSM kernel calls to the project's kernels for the plugin's layers.

vLLM's layers call their kernels through module globals (``mamba_mixer2`` and
``qwen_gdn_linear_attn``). :func:`install` wraps those globals once per process; a wrapper acts
only while one of the plugin's layers runs its forward (:func:`active`) **and** the call
addresses that layer's own state tensor, and otherwise calls vLLM's kernel unchanged. So every
other layer and model in the process keeps vLLM's behaviour, and vLLM's own control flow
(splitting prefill and decode rows, the conv kernels, the CUDA-graph padding) stays in charge.

All of this runs inside vLLM's opaque custom ops, so torch.compile never traces it. The wrapping
and the running-layer slot are :mod:`replayssm_quant.interception`'s.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .. import interception
from . import runtime

__all__ = ["active", "current_layer", "install"]

_CURRENT: interception.ContextSlot[Any] = interception.ContextSlot("replayssm_quant_layer")
_MARK = interception.ORIGINAL  # where a wrapper keeps vLLM's kernel (tests substitute it there)

MAMBA2_MODULE = "vllm.model_executor.layers.mamba.mamba_mixer2"
GDN_MODULE = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"


@contextlib.contextmanager
def active(layer: Any) -> Iterator[None]:
    """Mark ``layer`` as the layer whose forward is running."""
    with _CURRENT.holding(layer):
        yield


def current_layer() -> Any:
    return _CURRENT.get()


def _owner(state: Any, kind: str) -> Any:
    """The running plugin layer if ``state`` is its checkpoint tensor, else None."""
    layer = _CURRENT.get()
    if layer is None or layer.replayssm_settings.kind != kind:
        return None
    kv = getattr(layer, "kv_cache", ())
    if len(kv) < 2 or state is not kv[1] or layer.replayssm_cache is None:
        return None
    return layer


def _passthrough(wrapper: Callable) -> Callable:
    """vLLM's kernel behind ``wrapper``, looked up at call time (tests substitute it)."""
    return interception.original(wrapper)


def _layer_metadata(layer: Any) -> Any:
    from vllm.forward_context import get_forward_context

    md = get_forward_context().attn_metadata
    return md.get(layer.prefix) if isinstance(md, dict) else None


# ---------------------------------------------------------------------------------- Mamba-2
def _mamba2_decode(original: Callable) -> Callable:
    """``selective_state_update`` / ``selective_state_update_replayssm_output_only``."""

    def wrapper(state, x, dt, A, B, C, D=None, dt_bias=None, *args, **kwargs):
        layer = _owner(state, "mamba2")
        if layer is None:
            return _passthrough(wrapper)(state, x, dt, A, B, C, D, dt_bias, *args, **kwargs)
        if args or kwargs.get("z") is not None:
            raise RuntimeError("replayssm_quant: unexpected Mamba-2 decode call (positional "
                               "extras or a z gate); vLLM's call changed")
        if kwargs.get("num_accepted_tokens") is not None:
            raise RuntimeError("replayssm_quant: speculative Mamba-2 decode is not supported")
        out = kwargs.get("out")
        runtime.mamba2_decode(layer.replayssm_cache, x, dt, A, B, C, D, dt_bias,
                              dt_softplus=bool(kwargs.get("dt_softplus", False)),
                              state_indices=kwargs["state_batch_indices"], out=out)
        return out

    return wrapper


def _mamba2_prefill(original: Callable) -> Callable:
    """``mamba_chunk_scan_combined_varlen``: scan into an fp32 staging tensor instead of the
    checkpoint slots, start continued prefills from checkpoint + pending records, then refresh
    the checkpoint, read copy and cursor of the prefilled slots."""

    def wrapper(*args, **kwargs):
        layer = _owner(kwargs.get("final_states_out"), "mamba2")
        if layer is None:
            return _passthrough(wrapper)(*args, **kwargs)
        cache = layer.replayssm_cache
        slots = kwargs["final_state_indices"].long()
        n = slots.shape[0]
        H, P = cache.ckpt.data.shape[1:3]
        N = layer.ssm_state_size
        device = slots.device
        init = kwargs.get("initial_states")
        if init is not None:
            has = _layer_metadata(layer).has_initial_states_p
            zero = torch.zeros((), dtype=torch.float32, device=device)
            init = torch.where(has[:, None, None, None],
                               runtime.continued_state(cache, slots, layer.A), zero)
        staging = torch.empty((n, H, P, N), dtype=torch.float32, device=device)
        kwargs.update(initial_states=init, final_states_out=staging, state_dtype=torch.float32,
                      final_state_indices=torch.arange(n, dtype=torch.int32, device=device))
        result = _passthrough(wrapper)(*args, **kwargs)
        runtime.refresh_after_prefill(cache, slots, staging)
        return result

    return wrapper


# ---------------------------------------------------------------------------------- GDN
def _gdn_sigmoid_gating(original: Callable) -> Callable:
    """``fused_sigmoid_gating_delta_rule_update``: decode rows (one token each)."""

    def wrapper(*args, **kwargs):
        layer = _owner(kwargs.get("initial_state"), "gdn")
        if layer is None or args:
            return _passthrough(wrapper)(*args, **kwargs)
        if kwargs.get("num_accepted_tokens") is not None or kwargs.get("is_kda", False):
            raise RuntimeError("replayssm_quant: speculative GDN decode is not supported")
        q, k, v = kwargs["q"], kwargs["k"], kwargs["v"]
        cu = kwargs.get("cu_seqlens")
        g, beta = runtime.gdn_gates(kwargs["A_log"], kwargs["a"], kwargs["dt_bias"],
                                    kwargs["b"], softplus_beta=kwargs.get("beta", 1.0),
                                    threshold=kwargs.get("threshold", 20.0))
        scale = kwargs.get("scale") or q.shape[-1] ** -0.5
        o = runtime.gdn_decode(
            layer.replayssm_cache, q[0], k[0], v[0], g, beta,
            state_indices=kwargs["ssm_state_indices"], scale=scale,
            normalize=bool(kwargs.get("use_qk_l2norm_in_kernel", False)),
            valid_rows=None if cu is None else cu.shape[0] - 1)
        return o.to(q.dtype).unsqueeze(0), kwargs["initial_state"]

    return wrapper


def _gdn_packed_decode(original: Callable) -> Callable:
    """``fused_recurrent_gated_delta_rule_packed_decode``: decode-only batches."""

    def wrapper(*args, **kwargs):
        layer = _owner(kwargs.get("initial_state"), "gdn")
        if layer is None or args:
            return _passthrough(wrapper)(*args, **kwargs)
        mixed, out = kwargs["mixed_qkv"], kwargs["out"]
        rows = mixed.shape[0]
        hk = layer.num_k_heads // layer.tp_size
        hv = layer.num_v_heads // layer.tp_size
        K, V = layer.head_k_dim, layer.head_v_dim
        q, k, v = torch.split(mixed, [hk * K, hk * K, hv * V], dim=-1)
        g, beta = runtime.gdn_gates(kwargs["A_log"], kwargs["a"], kwargs["dt_bias"], kwargs["b"])
        o = runtime.gdn_decode(
            layer.replayssm_cache, q.reshape(rows, hk, K), k.reshape(rows, hk, K),
            v.reshape(rows, hv, V), g, beta, state_indices=kwargs["ssm_state_indices"],
            scale=kwargs["scale"], normalize=bool(kwargs.get("use_qk_l2norm_in_kernel", False)))
        out.copy_(o.view(out.shape))
        return out, kwargs["initial_state"]

    return wrapper


class GDNPrefillRefresh(torch.nn.Module):
    """Wraps a GDN layer's ``chunk_gated_delta_rule``: continued prefill rows start from
    checkpoint + pending records and, after the scan, refresh checkpoint, read copy and cursor.
    Returns the stored checkpoint bytes as the final state, so vLLM's own write of the final
    state into the slot leaves it unchanged."""

    def __init__(self, inner: torch.nn.Module, layer: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        object.__setattr__(self, "_layer_ref", layer)  # not a submodule: no cycle

    @property
    def gdn_prefill_backend(self) -> str:
        return self.inner.gdn_prefill_backend

    def forward(self, **kwargs):
        layer = self._layer_ref
        md = _layer_metadata(layer) if layer.replayssm_cache is not None else None
        if md is None or getattr(md, "prefill_state_indices", None) is None:
            return self.inner(**kwargs)
        cache = layer.replayssm_cache
        slots = md.prefill_state_indices.long()
        has = md.prefill_has_initial_state
        zero = torch.zeros((), dtype=torch.float32, device=slots.device)
        kwargs["initial_state"] = torch.where(
            has[:, None, None, None], runtime.continued_state(cache, slots), zero)
        o, final = self.inner(**kwargs)
        runtime.refresh_after_prefill(cache, slots, final)
        return o, cache.ckpt.data[slots].view(layer.kv_cache[1].dtype)


# ---------------------------------------------------------------------------------- install
_PATCHES: dict[str, dict[str, Callable[[Callable], Callable]]] = {
    MAMBA2_MODULE: {
        "selective_state_update_replayssm_output_only": _mamba2_decode,
        "selective_state_update": _mamba2_decode,
        "mamba_chunk_scan_combined_varlen": _mamba2_prefill,
    },
    GDN_MODULE: {
        "fused_sigmoid_gating_delta_rule_update": _gdn_sigmoid_gating,
        "fused_recurrent_gated_delta_rule_packed_decode": _gdn_packed_decode,
    },
}


def install(module_name: str) -> None:
    """Wrap the kernel globals of one vLLM layer module (idempotent)."""
    for name, make in _PATCHES[module_name].items():
        try:
            interception.install(module_name, name, make)
        except interception.MissingTarget:
            raise RuntimeError(f"replayssm_quant: {module_name}.{name} is missing; this vLLM "
                               f"is not the 0.33 series the plugin supports") from None


def original(module_name: str, name: str) -> Callable:
    """vLLM's own kernel behind a wrapped global (for tests and debugging)."""
    import importlib

    return interception.original(getattr(importlib.import_module(module_name), name))
