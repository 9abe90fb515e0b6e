"""The drift patch: a model's SSM scans replaced by prefill + decode emulation of a config.

A teacher-forced drift measurement needs the whole sequence to go through the model once, with
every SSM layer behaving as it would in a decode loop under a precision config. Reimplementing
each mixer would drift away from the upstream model code, so the patch keeps the model's own
``forward`` (projections, convolution, gating, norms) and replaces only the module-level chunked
scan it calls (through :mod:`replayssm_quant.interception`): the first ``prefill`` tokens still go
through the model's exact chunked scan, and the remaining tokens go through the config's decode
emulation (:func:`replayssm_quant.kernels.emulate_mamba2` /
:func:`~replayssm_quant.kernels.emulate_gdn`) starting from the prefill's final state. Attention,
MLP, norms and the LM head are untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from .. import interception
from ..precision import PrecisionConfig, parse_config
from .registry import SSMLayer, architecture, ssm_layers

__all__ = ["DecayObserver", "ModelPatch", "gdn_l2norm", "patch_model"]


class DecayObserver(Protocol):
    """Receives each SSM layer's per-token decay ``(B, T, H)`` (e.g.
    :class:`replayssm_quant.evals.decay.DecayRecorder`)."""

    def add(self, layer: int, kind: str, decay: torch.Tensor) -> None: ...


# ----------------------------------------------------------------------------------- patching
@dataclass
class _Active:
    patch: ModelPatch
    layer: SSMLayer


def _refuse_cached_decode(active: _Active, forward_kwargs: dict) -> None:
    """A cached single-token decode call would silently bypass the emulation: refuse it."""
    cache = forward_kwargs.get("cache_params")
    if cache is not None and cache.has_previous_state(active.layer.layer):
        raise RuntimeError(
            "a patched model emulates whole teacher-forced sequences; call it without a "
            "cache (use_cache=False)")


_ACTIVE: interception.ContextSlot[_Active] = interception.ContextSlot("replayssm_current_mixer")
"""The patch and layer whose mixer forward is running in this thread / task."""


def _mamba2_args(hidden_states, dt, A, B, C, chunk_size=None, D=None, dt_bias=None,
                 initial_states=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                 return_final_states=False, **kwargs) -> dict:
    """Name the arguments of a ``mamba2_chunk_scan`` call whichever way they were passed."""
    if chunk_size is not None:
        kwargs["chunk_size"] = chunk_size
    return dict(hidden_states=hidden_states, dt=dt, A=A, B=B, C=C, D=D, dt_bias=dt_bias,
                initial_states=initial_states, dt_softplus=dt_softplus, dt_limit=dt_limit,
                return_final_states=return_final_states, extra=kwargs)


def _gdn_args(query, key, value, g, beta, chunk_size=None, initial_state=None,
              output_final_state=False, use_qk_l2norm_in_kernel=False, **kwargs) -> dict:
    """Name the arguments of a ``torch_chunk_gated_delta_rule`` call."""
    if chunk_size is not None:
        kwargs["chunk_size"] = chunk_size
    return dict(query=query, key=key, value=value, g=g, beta=beta, initial_state=initial_state,
                output_final_state=output_final_state,
                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, extra=kwargs)


def gdn_l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """The L2 normalisation of the transformers GDN scans (and of FLA): ``rsqrt(sum x^2 + eps)``,
    bit for bit."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _make_scan(original: Callable) -> Callable:
    def scan(*args, **kwargs):
        active = _ACTIVE.get()
        if active is None:
            return original(*args, **kwargs)
        return active.patch._scan(active.layer, original, args, kwargs)

    return scan


class ModelPatch:
    """Context manager: while active, every forward of ``model`` runs its SSM layers as
    prefill (exact chunked scan of the first ``prefill`` tokens) + decode emulation of ``cfg``.

    Only whole-sequence forwards without a cache are emulated; a cached single-token decode
    call would silently bypass the emulation, so it raises instead.
    """

    def __init__(self, model: torch.nn.Module, cfg: PrecisionConfig | str, *, prefill: int,
                 seed: int = 0, decay: DecayObserver | None = None) -> None:
        if prefill < 0:
            raise ValueError(f"prefill must be >= 0, got {prefill}")
        self.model = model
        self.cfg = parse_config(cfg)
        self.prefill = int(prefill)
        self.seed = int(seed)
        self.decay = decay
        self.arch = architecture(model)
        self.layers = ssm_layers(model)
        self._handles: list = []
        self._entered = False

    # -- context management
    def __enter__(self) -> ModelPatch:
        if self._entered:
            raise RuntimeError("ModelPatch is not re-entrant; create a new one")
        interception.acquire(self.arch.module, self.arch.scan, _make_scan)
        self._entered = True
        try:
            self._handles = interception.hold_during_forward(
                _ACTIVE, ((layer.module, _Active(self, layer)) for layer in self.layers),
                before=_refuse_cached_decode)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self._entered:
            interception.release(self.arch.module, self.arch.scan)
            self._entered = False

    # -- the patched scans
    def _scan(self, layer: SSMLayer, original, args: tuple, kwargs: dict):
        if layer.kind == "mamba2":
            return self._mamba2(layer, original, _mamba2_args(*args, **kwargs))
        return self._gdn(layer, original, _gdn_args(*args, **kwargs))

    def _mamba2(self, layer: SSMLayer, original, a: dict):
        from .. import kernels

        x, dt_raw, A = a["hidden_states"], a["dt"], a["A"]
        T = x.shape[1]
        P = min(self.prefill, T)
        dt = dt_raw.float()
        if a["dt_bias"] is not None:
            dt = dt + a["dt_bias"].detach().float()
        if a["dt_softplus"]:
            dt = F.softplus(dt)
        lo, hi = a["dt_limit"]
        dt = torch.clamp(dt, min=lo, max=hi)
        A32 = A.detach().float()
        if self.decay is not None:
            self.decay.add(layer.layer, "mamba2", torch.exp(dt * A32))
        call = {k: v for k, v in a.items() if k != "extra"} | a["extra"]
        if P >= T:
            return original(**call)
        if P > 0:
            pre = call | {"hidden_states": x[:, :P], "dt": dt_raw[:, :P], "B": a["B"][:, :P],
                          "C": a["C"][:, :P], "return_final_states": True}
            y_pre, S0 = original(**pre)
        else:
            y_pre, S0 = None, a["initial_states"]
        D = a["D"].detach().float() if a["D"] is not None else None
        y, S_final = kernels.emulate_mamba2(
            self.cfg, S0.float().contiguous() if S0 is not None else None,
            x[:, P:].contiguous(), dt[:, P:].contiguous(), A32, a["B"][:, P:].contiguous(),
            a["C"][:, P:].contiguous(), D, layer=layer.layer, seed=self.seed, act_dtype=x.dtype)
        out = y if y_pre is None else torch.cat([y_pre, y.to(y_pre.dtype)], dim=1)
        if a["return_final_states"]:
            return out, S_final
        return out

    def _gdn(self, layer: SSMLayer, original, a: dict):
        from .. import kernels

        q, k, v, g, beta = a["query"], a["key"], a["value"], a["g"], a["beta"]
        T = q.shape[1]
        P = min(self.prefill, T)
        if self.decay is not None:
            self.decay.add(layer.layer, "gdn", torch.exp(g.detach().float()))
        call = {kk: vv for kk, vv in a.items() if kk != "extra"} | a["extra"]
        if P >= T:
            return original(**call)
        if P > 0:
            pre = call | {"query": q[:, :P], "key": k[:, :P], "value": v[:, :P], "g": g[:, :P],
                          "beta": beta[:, :P], "output_final_state": True}
            o_pre, S0 = original(**pre)
        else:
            o_pre, S0 = None, a["initial_state"]
        qd, kd = q[:, P:].float(), k[:, P:].float()
        if a["use_qk_l2norm_in_kernel"]:
            qd, kd = gdn_l2norm(qd), gdn_l2norm(kd)
        qd = qd * qd.shape[-1] ** -0.5
        qd, kd = _dedupe_key_heads(qd, layer), _dedupe_key_heads(kd, layer)
        S0v = S0.float().transpose(-1, -2).contiguous() if S0 is not None else None
        o, S_final = kernels.emulate_gdn(
            self.cfg, S0v, qd.contiguous(), kd.contiguous(), v[:, P:].contiguous(),
            g[:, P:].float().contiguous(), beta[:, P:].float().contiguous(),
            layer=layer.layer, seed=self.seed, act_dtype=v.dtype)
        out_dtype = o_pre.dtype if o_pre is not None else q.dtype
        o = o.to(out_dtype)
        out = o if o_pre is None else torch.cat([o_pre, o], dim=1)
        final = S_final.transpose(-1, -2).contiguous() if a["output_final_state"] else None
        return out, final


def _dedupe_key_heads(t: torch.Tensor, layer: SSMLayer) -> torch.Tensor:
    """Undo the mixer's ``repeat_interleave`` of q/k over value heads (value head ``h`` reads key
    head ``h // ratio``), so the emulation sees the real key heads; kept as is if the heads
    were not repeated that way."""
    heads, groups = layer.heads, layer.groups
    if t.shape[2] != heads or heads == groups:
        return t
    ratio = heads // groups
    sub = t[:, :, ::ratio]
    if torch.equal(sub.repeat_interleave(ratio, dim=2), t):
        return sub
    return t


def patch_model(model: torch.nn.Module, cfg: PrecisionConfig | str, *, prefill: int,
                seed: int = 0, decay: DecayObserver | None = None) -> ModelPatch:
    """Patch ``model``'s SSM mixers for teacher-forced emulation of ``cfg`` (a context manager
    that restores the model on exit).

    >>> with patch_model(model, "nvfp4-read/fp32", prefill=512, seed=0):
    ...     logits = model(input_ids, use_cache=False).logits
    """
    return ModelPatch(model, cfg, prefill=prefill, seed=seed, decay=decay)
