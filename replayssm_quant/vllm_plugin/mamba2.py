"""Mamba-2 (NemotronH): the plugin's ``MambaMixer2`` and the model classes that size its page.

Importing this module registers :class:`ReplaySSMMambaMixer2` as vLLM's out-of-tree
``MambaMixer2`` (the layer swap happens when the model builds its layers) and wraps the
Mamba-2 kernel globals (:mod:`.hooks`). vLLM imports it only when it resolves one of the
architectures registered in :func:`replayssm_quant.vllm_plugin.register`.
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2
from vllm.model_executor.models.nemotron_h import NemotronHForCausalLM

from . import hooks
from .common import PluginLayerMixin, PluginModelMixin

__all__ = ["ReplaySSMMambaMixer2", "ReplaySSMNemotronHForCausalLM", "register_layer"]


class ReplaySSMMambaMixer2(PluginLayerMixin, MambaMixer2):
    """``MambaMixer2`` with the precision split when enabled: checkpoint in place of the SSM
    state, read copy and scales in the page tail, decode on the project's kernels, checkpoint
    and read copy refreshed after prefill."""

    replayssm_kind = "mamba2"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._replayssm_init()

    def conv_ssm_forward(self, projected_states: torch.Tensor, output: torch.Tensor):
        if not self.replayssm_enabled:
            return super().conv_ssm_forward(projected_states, output)
        with hooks.active(self):
            return super().conv_ssm_forward(projected_states, output)

    def _warmup_ssd_kernels(self, projected_states: torch.Tensor) -> None:
        if not self.replayssm_enabled:
            return super()._warmup_ssd_kernels(projected_states)
        return self._replayssm_warming(super()._warmup_ssd_kernels, projected_states)


class ReplaySSMNemotronHForCausalLM(PluginModelMixin, NemotronHForCausalLM):
    """NemotronH (also registered as NemotronHPuzzleForCausalLM) with the plugin's page size."""

    replayssm_kind = "mamba2"


def register_layer() -> None:
    """Make vLLM build :class:`ReplaySSMMambaMixer2` wherever it builds a ``MambaMixer2``."""
    from vllm.model_executor.custom_op import op_registry_oot

    current = op_registry_oot.get("MambaMixer2")
    if current is None:
        MambaMixer2.register_oot(ReplaySSMMambaMixer2)
    elif current is not ReplaySSMMambaMixer2:
        raise RuntimeError(f"another plugin already replaces MambaMixer2 with {current}; "
                           f"replayssm_quant cannot share that layer")
    hooks.install(hooks.MAMBA2_MODULE)


register_layer()
