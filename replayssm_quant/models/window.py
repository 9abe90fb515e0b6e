"""Sliding-window attention for hybrid models whose Hugging Face class ignores ``sliding_window``.

A fixture whose attention layer sees the whole context answers every retrieval from its exact
KV cache, so the precision of the SSM state can never change an answer. Limiting attention to
the last ``sliding_window`` tokens makes anything further back pass through the SSM state,
which is what an accuracy probe of state precision needs. ``NemotronHConfig`` has a
``sliding_window`` field that its modeling code does not read, and Qwen3.5's text config has
none; this module registers an attention implementation (``transformers.AttentionInterface``)
that applies it, and :func:`apply_attention_window` switches a loaded model of either kind to it
when its config sets a window.

The window counts keys, not positions: the query at key index ``i`` sees keys ``i - W + 1 .. i``
(``W = sliding_window``), within the mask transformers builds (causality and padding). Left
padding keeps every row's real tokens contiguous at the end, so the band is the same for
every row of a batch.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["WINDOW_ATTENTION", "WINDOW_MODEL_TYPES", "apply_attention_window", "attention_window",
           "band_mask"]

WINDOW_ATTENTION = "replayssm_window"
"""Name of the registered attention implementation (sdpa with a key-window band)."""

WINDOW_MODEL_TYPES = frozenset({"nemotron_h", "qwen3_5", "qwen3_5_text"})
"""Model types whose attention goes through ``AttentionInterface`` without reading
``sliding_window`` (their modeling code gives every attention layer the whole context)."""

_registered = False


def band_mask(q_len: int, kv_len: int, window: int, device: torch.device | str) -> torch.Tensor:
    """``[q_len, kv_len]`` bool: query ``j`` (key index ``kv_len - q_len + j``) may see key ``k``
    when ``0 <= index - k < window``."""
    q_idx = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
    k_idx = torch.arange(kv_len, device=device)[None, :]
    diff = q_idx - k_idx
    return (diff >= 0) & (diff < window)


def _window_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                 value: torch.Tensor, attention_mask: torch.Tensor | None, **kwargs: Any):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    window = getattr(module.config, "sliding_window", None)
    if not window:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    q_len, kv_len = query.shape[-2], key.shape[-2]
    band = band_mask(q_len, kv_len, int(window), query.device)
    if attention_mask is None:
        mask = band[None, None]
    else:
        given = attention_mask[..., :kv_len]
        if given.dtype != torch.bool:  # additive float mask: 0 where allowed
            given = given == 0
        mask = given & band
        # A padded query row may see nothing; let it see itself so that no row is all -inf
        # (a NaN there would reach the SSM layers through the padded positions).
        empty = ~mask.any(dim=-1, keepdim=True)
        mask = mask | (empty & band_mask(q_len, kv_len, 1, query.device))
    kwargs.pop("is_causal", None)
    return sdpa_attention_forward(module, query, key, value, mask, is_causal=False, **kwargs)


def register() -> None:
    """Register :data:`WINDOW_ATTENTION` with transformers (attention and mask interfaces)."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(WINDOW_ATTENTION, _window_sdpa)
    AttentionMaskInterface.register(WINDOW_ATTENTION, sdpa_mask)
    _registered = True


def attention_window(config: Any) -> int | None:
    """The window a model's config asks for (``sliding_window`` on the text config), if any."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    window = getattr(text, "sliding_window", None)
    return int(window) if window else None


def apply_attention_window(model: torch.nn.Module) -> torch.nn.Module:
    """Switch ``model`` to the windowed attention when its config sets ``sliding_window`` and
    its modeling code ignores it (:data:`WINDOW_MODEL_TYPES`); other models are returned
    unchanged."""
    config = model.config
    if attention_window(config) is None or getattr(config, "model_type", "") not in WINDOW_MODEL_TYPES:
        return model
    register()
    model.set_attn_implementation(WINDOW_ATTENTION)
    return model
