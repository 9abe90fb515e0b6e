"""A loaded model's decoder and LM head, run separately (so logits can be made in chunks)."""

from __future__ import annotations

import torch

__all__ = ["decoder_hidden_states", "lm_head_logits"]


def decoder_hidden_states(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """Final hidden states (after the last norm, before the LM head) of a whole sequence.

    Running the decoder alone lets the caller apply the LM head in chunks, so a long sequence
    never materialises a ``T x vocab`` logits tensor.
    """
    decoder = model.get_decoder()
    out = decoder(input_ids=input_ids, use_cache=False)
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def lm_head_logits(model: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """FP32 logits of the model's LM head for ``hidden`` (any leading shape)."""
    head = model.get_output_embeddings()
    logits = head(hidden.to(head.weight.dtype)).float()
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


