"""What the plugin's Mamba-2 and GDN layer and model subclasses share.

A layer is *enabled* when the model's architecture is one the plugin covers and
``--additional-config`` has a ``replayssm_quant`` entry; otherwise it behaves exactly like the
in-tree layer (same page, same kernels). Layer and model class size the page with the same call
(:func:`replayssm_quant.vllm_plugin.layout.extend_page` on the in-tree entries), so vLLM's check
that the layer's page equals the class's page holds by construction.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from ..kernels.core.cache import ReplayCache
from . import runtime
from .layout import PageLayout, extend_page
from .settings import PluginSettings, settings_for

__all__ = ["PluginLayerMixin", "PluginModelMixin", "page_for"]


def page_for(settings: PluginSettings, stock_shapes, stock_dtypes, *, k_heads: int,
             act_dtype: torch.dtype) -> PageLayout:
    """The page of one enabled layer from its in-tree entries. ``k_heads``: GDN key heads on
    this rank (Mamba-2 takes its groups from the stock B ring)."""
    stock_shapes = tuple(tuple(s) for s in stock_shapes)
    if settings.kind == "mamba2":
        groups = stock_shapes[4][0] if len(stock_shapes) == 5 else 0
    else:
        groups = k_heads
    return extend_page(settings.kind, settings.config, stock_shapes, tuple(stock_dtypes),
                       groups=groups, act_dtype=act_dtype)


class PluginLayerMixin:
    """Mixed in before the in-tree layer class (``MambaMixer2``, ``QwenGatedDeltaNetAttention``).

    Adds the plugin's page entries, cuts the kernels' cache out of the page at bind time, and
    keeps the per-slot cursor and flush index beside the page.
    """

    replayssm_kind: ClassVar[str]
    replayssm_settings: PluginSettings | None = None
    replayssm_cache: ReplayCache | None = None

    def _replayssm_init(self) -> None:
        from vllm.config import get_current_vllm_config
        from vllm.model_executor.models.utils import extract_layer_index

        settings = settings_for(get_current_vllm_config())
        if settings is None or settings.kind != self.replayssm_kind:
            self.replayssm_settings = None
            return
        self.replayssm_settings = settings
        self.replayssm_layer_index = extract_layer_index(self.prefix)
        self._replayssm_warmup = False
        self.replayssm_cache = None

    @property
    def replayssm_enabled(self) -> bool:
        return self.replayssm_settings is not None

    def _replayssm_k_heads(self) -> int:
        return 0

    def replayssm_page(self) -> PageLayout:
        """This layer's page (only when enabled)."""
        assert self.replayssm_settings is not None
        return page_for(self.replayssm_settings, super().get_state_shape(),
                        super().get_state_dtype(), k_heads=self._replayssm_k_heads(),
                        act_dtype=self.model_config.dtype)

    def get_state_shape(self):
        if not self.replayssm_enabled:
            return super().get_state_shape()
        return self.replayssm_page().shapes

    def get_state_dtype(self):
        if not self.replayssm_enabled:
            return super().get_state_dtype()
        dtypes = list(self.replayssm_page().dtypes)
        if self._replayssm_warmup:
            dtypes[1] = torch.float32  # prefill kernels are autotuned on the fp32 staging state
        return tuple(dtypes)

    def bind_kv_cache(self, kv_cache: torch.Tensor) -> None:
        super().bind_kv_cache(kv_cache)
        if not self.replayssm_enabled:
            return
        pages = kv_cache.squeeze(dim=(1, 2)) if kv_cache.dim() == 4 else kv_cache
        n, device = pages.shape[0], pages.device
        self.replayssm_cache = runtime.cache_from_page(
            self.replayssm_page(), pages, self.replayssm_settings.config,
            cursor=torch.zeros(n, dtype=torch.int32, device=device),
            flush_index=torch.zeros(n, dtype=torch.int32, device=device),
            nan_count=torch.zeros(1, dtype=torch.int32, device=device),
            layer=self.replayssm_layer_index, seed=self.replayssm_settings.seed)

    def _replayssm_warming(self, fn, *args: Any) -> Any:
        self._replayssm_warmup = True
        try:
            return fn(*args)
        finally:
            self._replayssm_warmup = False


class PluginModelMixin:
    """Mixed in before an in-tree model class: the class-side page sizing."""

    replayssm_kind: ClassVar[str]

    @classmethod
    def _replayssm_class_page(cls, vllm_config: Any) -> PageLayout | None:
        settings = settings_for(vllm_config)
        if settings is None or settings.kind != cls.replayssm_kind:
            return None
        base = super()
        shapes = base.get_mamba_state_shape_from_config(vllm_config)
        dtypes = base.get_mamba_state_dtype_from_config(vllm_config)
        k_heads = 0
        if settings.kind == "gdn":
            hf = vllm_config.model_config.hf_text_config
            k_heads = hf.linear_num_key_heads // vllm_config.parallel_config.tensor_parallel_size
        return page_for(settings, shapes, dtypes, k_heads=k_heads,
                        act_dtype=vllm_config.model_config.dtype)

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config: Any):
        page = cls._replayssm_class_page(vllm_config)
        if page is None:
            return super().get_mamba_state_shape_from_config(vllm_config)
        return page.shapes

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config: Any):
        page = cls._replayssm_class_page(vllm_config)
        if page is None:
            return super().get_mamba_state_dtype_from_config(vllm_config)
        return page.dtypes
