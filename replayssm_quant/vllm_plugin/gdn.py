"""Gated DeltaNet (Qwen3-Next, Qwen3.5 dense/MoE, text and multimodal): ReplaySSM where vLLM
has none, plus the precision split.

The page gains the ring (``k``, ``u``, ``g``, and ``v``, ``beta`` when non-flush steps read a
read copy), the read copy and the scales; the per-slot cursor lives on the device and is
advanced by the kernels, so vLLM's GDN metadata builder needs no change. Decode rows (decode-only
and mixed batches) run the project's GDN kernels; prefill rows run vLLM's chunked scan and then
refresh checkpoint, read copy and cursor. Importing this module registers
:class:`ReplaySSMQwenGDN` as vLLM's out-of-tree ``QwenGatedDeltaNetAttention``.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import (
    QwenGatedDeltaNetAttention,
)
from vllm.model_executor.models.qwen3_5 import (
    Qwen3_5ForCausalLM,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeForConditionalGeneration,
)
from vllm.model_executor.models.qwen3_next import Qwen3NextForCausalLM

from . import hooks
from .common import PluginLayerMixin, PluginModelMixin

__all__ = [
    "ReplaySSMQwen3NextForCausalLM",
    "ReplaySSMQwen3_5ForCausalLM",
    "ReplaySSMQwen3_5ForConditionalGeneration",
    "ReplaySSMQwen3_5MoeForCausalLM",
    "ReplaySSMQwen3_5MoeForConditionalGeneration",
    "ReplaySSMQwenGDN",
    "register_layer",
]


class ReplaySSMQwenGDN(PluginLayerMixin, QwenGatedDeltaNetAttention):
    """``QwenGatedDeltaNetAttention`` with ReplaySSM and the precision split when enabled."""

    replayssm_kind = "gdn"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._replayssm_init()
        if self.replayssm_enabled:
            self.chunk_gated_delta_rule = hooks.GDNPrefillRefresh(self.chunk_gated_delta_rule,
                                                                  self)

    def _replayssm_k_heads(self) -> int:
        return self.num_k_heads // self.tp_size

    def _forward_core(self, mixed_qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
                      core_attn_out: torch.Tensor):
        if not self.replayssm_enabled:
            return super()._forward_core(mixed_qkv, b, a, core_attn_out)
        with hooks.active(self):
            return super()._forward_core(mixed_qkv, b, a, core_attn_out)

    def _warmup_prefill_kernels(self, qkv_or_qkvz: torch.Tensor, v_dim: int) -> None:
        if not self.replayssm_enabled:
            return super()._warmup_prefill_kernels(qkv_or_qkvz, v_dim)
        return self._replayssm_warming(super()._warmup_prefill_kernels, qkv_or_qkvz, v_dim)


class _GDNModel(PluginModelMixin):
    replayssm_kind = "gdn"
    supports_replayssm: ClassVar[Literal[True]] = True


class ReplaySSMQwen3NextForCausalLM(_GDNModel, Qwen3NextForCausalLM):
    """Qwen3-Next with the plugin's page size; accepts ``--use-replayssm``."""


class ReplaySSMQwen3_5ForCausalLM(_GDNModel, Qwen3_5ForCausalLM):
    """Qwen3.5 dense (text) with the plugin's page size; accepts ``--use-replayssm``."""


class ReplaySSMQwen3_5MoeForCausalLM(_GDNModel, Qwen3_5MoeForCausalLM):
    """Qwen3.5 MoE (text) with the plugin's page size; accepts ``--use-replayssm``."""


class ReplaySSMQwen3_5ForConditionalGeneration(_GDNModel, Qwen3_5ForConditionalGeneration):
    """Qwen3.5 dense (multimodal) with the plugin's page size; accepts ``--use-replayssm``."""


class ReplaySSMQwen3_5MoeForConditionalGeneration(_GDNModel,
                                                  Qwen3_5MoeForConditionalGeneration):
    """Qwen3.5 MoE (multimodal) with the plugin's page size; accepts ``--use-replayssm``."""


def register_layer() -> None:
    """Make vLLM build :class:`ReplaySSMQwenGDN` wherever it builds the Qwen GDN layer."""
    from vllm.model_executor.custom_op import op_registry_oot

    current = op_registry_oot.get("QwenGatedDeltaNetAttention")
    if current is None:
        QwenGatedDeltaNetAttention.register_oot(ReplaySSMQwenGDN)
    elif current is not ReplaySSMQwenGDN:
        raise RuntimeError(f"another plugin already replaces QwenGatedDeltaNetAttention with "
                           f"{current}; replayssm_quant cannot share that layer")
    hooks.install(hooks.GDN_MODULE)


register_layer()
