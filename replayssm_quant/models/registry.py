"""Which Hugging Face hybrid models are supported, and where their SSM mixers are.

A model family is known by its ``config.model_type``: the modeling module, the mixer class and the
module-level chunked scan that mixer calls (the global :mod:`replayssm_quant.models.patch`
intercepts). :func:`ssm_layers` finds every mixer of a loaded model with its decode shape, and
:func:`model_shape` turns that into the cost model's :class:`~replayssm_quant.precision.ModelShape`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ..precision import ModelShape

__all__ = [
    "ARCHITECTURES",
    "Architecture",
    "SSMLayer",
    "UnsupportedArchitecture",
    "architecture",
    "iter_ssm_modules",
    "model_shape",
    "ssm_layers",
    "supported_text",
]



@dataclass(frozen=True)
class Architecture:
    """Where one model family keeps its SSM mixer and the chunked scan that mixer calls."""

    kind: str  # "mamba2" or "gdn"
    module: str  # transformers modeling module
    mixer: str  # mixer class name in that module
    scan: str  # module-level chunked-scan function the mixer's forward calls


_NEMOTRON_H = Architecture("mamba2", "transformers.models.nemotron_h.modeling_nemotron_h",
                           "NemotronHMamba2Mixer", "mamba2_chunk_scan")
_MAMBA2 = Architecture("mamba2", "transformers.models.mamba2.modeling_mamba2", "Mamba2Mixer",
                       "mamba2_chunk_scan")
_QWEN3_5 = Architecture("gdn", "transformers.models.qwen3_5.modeling_qwen3_5",
                        "Qwen3_5GatedDeltaNet", "torch_chunk_gated_delta_rule")
_QWEN3_5_MOE = Architecture("gdn", "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
                            "Qwen3_5MoeGatedDeltaNet", "torch_chunk_gated_delta_rule")
_QWEN3_NEXT = Architecture("gdn", "transformers.models.qwen3_next.modeling_qwen3_next",
                           "Qwen3NextGatedDeltaNet", "torch_chunk_gated_delta_rule")

ARCHITECTURES: dict[str, Architecture] = {
    "nemotron_h": _NEMOTRON_H,
    "mamba2": _MAMBA2,
    "qwen3_5": _QWEN3_5,
    "qwen3_5_text": _QWEN3_5,
    "qwen3_5_moe": _QWEN3_5_MOE,
    "qwen3_5_moe_text": _QWEN3_5_MOE,
    "qwen3_next": _QWEN3_NEXT,
}
"""Supported ``config.model_type`` values (Mamba-2: NemotronH, Mamba2; GDN: Qwen3.5 dense and
MoE, text-only or with the vision tower, and Qwen3-Next)."""


class UnsupportedArchitecture(ValueError):
    """The model has no SSM mixer this package knows how to emulate."""


def supported_text() -> str:
    """The supported model types, for error messages."""
    return ", ".join(sorted(ARCHITECTURES))


def architecture(model_or_config: Any) -> Architecture:
    """The :class:`Architecture` of a model or config; one clear error if it has none."""
    config = getattr(model_or_config, "config", model_or_config)
    model_type = getattr(config, "model_type", None)
    if model_type not in ARCHITECTURES:
        raise UnsupportedArchitecture(
            f"unsupported architecture {model_type!r}: replayssm-quant emulates the SSM layers of "
            f"model types {supported_text()}"
        )
    return ARCHITECTURES[model_type]


# ----------------------------------------------------------------------------------- layers
@dataclass(frozen=True)
class SSMLayer:
    """One SSM mixer of a loaded model, with its decode shape.

    mamba2: ``heads`` x ``head_dim`` (P) x ``d_state`` (N), ``groups`` B/C groups.
    gdn: ``heads`` value heads x ``head_dim`` (d_v) x ``d_state`` (d_k), ``groups`` key heads.
    ``layer`` is the model's layer index, the ``layer`` key of stochastic rounding.
    """

    layer: int
    name: str
    kind: str
    heads: int
    head_dim: int
    d_state: int
    groups: int
    module: torch.nn.Module = field(repr=False, compare=False)


def _mixer_class(arch: Architecture) -> type:
    return getattr(importlib.import_module(arch.module), arch.mixer)


def ssm_layers(model: torch.nn.Module) -> list[SSMLayer]:
    """Every SSM mixer of ``model`` in layer order (raises for unsupported models)."""
    arch = architecture(model)
    cls = _mixer_class(arch)
    layers: list[SSMLayer] = []
    for name, mod in model.named_modules():
        if not isinstance(mod, cls):
            continue
        if arch.kind == "mamba2":
            dims = (mod.num_heads, mod.head_dim, mod.ssm_state_size, mod.n_groups)
        else:
            dims = (mod.num_v_heads, mod.head_v_dim, mod.head_k_dim, mod.num_k_heads)
        layers.append(SSMLayer(int(mod.layer_idx), name, arch.kind, *dims, module=mod))
    if not layers:
        raise UnsupportedArchitecture(
            f"model {type(model).__name__} has no {arch.mixer} layer; nothing to emulate"
        )
    return sorted(layers, key=lambda s: s.layer)


def model_shape(model: torch.nn.Module, name: str | None = None) -> ModelShape:
    """The per-layer SSM decode shape of ``model`` for the cost model (all its SSM layers share it).

    ``act_bytes`` is the element size of the model's parameters: the ring stores activations
    in the compute dtype.
    """
    layers = ssm_layers(model)
    first = layers[0]
    dims = {(s.kind, s.heads, s.head_dim, s.d_state, s.groups) for s in layers}
    if len(dims) > 1:
        raise ValueError(f"SSM layers of {type(model).__name__} differ in shape: {sorted(dims)}")
    label = name or str(getattr(model.config, "name_or_path", "") or type(model).__name__)
    act_bytes = next(model.parameters()).element_size()
    return ModelShape(label, first.kind, first.heads, first.head_dim, first.d_state, first.groups,
                      layers=len(layers), act_bytes=act_bytes)



def iter_ssm_modules(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """The SSM mixer modules of ``model``."""
    for layer in ssm_layers(model):
        yield layer.module
