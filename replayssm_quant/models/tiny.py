"""Tiny randomly initialised models of every supported architecture.

Plumbing checks (tests, ``random:<model_type>`` model names) need a real model of each production
Hugging Face class but no weights: these are a few hundred thousand parameters, deterministic for
a seed, with a byte-level tokenizer that reads any text.
"""

from __future__ import annotations

from typing import Any

import torch

from .registry import UnsupportedArchitecture, supported_text

__all__ = ["RANDOM_PREFIX", "SHAPED_MODELS", "byte_tokenizer", "shaped_model", "tiny_model"]
RANDOM_PREFIX = "random:"
"""``random:<model_type>`` names a tiny randomly initialised model of a supported architecture:
plumbing checks that need no weights."""


def _tiny_config(model_type: str):
    """A small config of ``model_type`` whose SSM rows are 32 long (NVFP4 packs 32-element rows)."""
    import transformers as tf

    attn = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    gdn = dict(hidden_size=64, num_hidden_layers=4, intermediate_size=128,
               layer_types=["linear_attention", "linear_attention", "full_attention",
                            "linear_attention"],
               linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
               linear_value_head_dim=16, linear_conv_kernel_dim=4, vocab_size=256,
               tie_word_embeddings=False, **attn)
    moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
               shared_expert_intermediate_size=32)
    if model_type == "nemotron_h":
        return tf.NemotronHConfig(
            vocab_size=256, hidden_size=64, hybrid_override_pattern="M-M*M-",
            mamba_num_heads=8, mamba_head_dim=16, n_groups=2, ssm_state_size=32, conv_kernel=4,
            chunk_size=16, intermediate_size=128, **attn)
    if model_type == "mamba2":
        return tf.Mamba2Config(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_heads=8,
                               head_dim=16, expand=2, n_groups=2, state_size=32, chunk_size=16)
    if model_type == "qwen3_5_text":
        return tf.Qwen3_5TextConfig(**gdn)
    if model_type == "qwen3_5":
        return tf.Qwen3_5Config(text_config=gdn)
    if model_type == "qwen3_5_moe_text":
        return tf.Qwen3_5MoeTextConfig(**gdn, **moe)
    if model_type == "qwen3_5_moe":
        return tf.Qwen3_5MoeConfig(text_config=gdn | moe)
    if model_type == "qwen3_next":
        return tf.Qwen3NextConfig(**gdn, **moe)
    raise UnsupportedArchitecture(
        f"unsupported architecture {model_type!r}: replayssm-quant emulates the SSM layers of "
        f"model types {supported_text()}")


def byte_tokenizer():
    """A 256-token byte-level tokenizer (no merges), so random models can read any text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def tiny_model(model_type: str, seed: int = 0) -> tuple[torch.nn.Module, Any]:
    """``(model, tokenizer)``: a tiny randomly initialised FP32 model of ``model_type`` (one of
    :data:`ARCHITECTURES`) with a byte-level tokenizer; deterministic for a given ``seed``."""
    from transformers import AutoModelForCausalLM

    config = _tiny_config(model_type)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.config.name_or_path = f"{RANDOM_PREFIX}{model_type}"
    model.eval()
    return model, byte_tokenizer()



_NANO_4B_PATTERN = "M-M-M-MM-M-M*-M-M*-M-M-M*-M-M-MM*-MMM-M-M-"
"""NVIDIA-Nemotron-3-Nano-4B's 42 layers (M = Mamba-2, - = MLP, * = attention)."""

SHAPED_MODELS: dict[str, int] = {"qwen3.5-4b": 4, "nemotron-3-nano-4b": 13}
"""``random:<name>`` models with a real model's layer shapes, and their default layer count:
the real layer pattern up to and including its first attention layer."""


def _shaped_config(name: str, layers: int):
    """The Hugging Face config of ``name`` (a :data:`SHAPED_MODELS` key; its SSM layers are
    ``precision.SHAPES[name]``) cut to the first ``layers`` layers of the real pattern."""
    import transformers as tf

    if name == "qwen3.5-4b":
        types = (["linear_attention"] * 3 + ["full_attention"]) * 8
        return tf.Qwen3_5TextConfig(
            vocab_size=248320, hidden_size=2560, intermediate_size=9216,
            num_hidden_layers=layers, layer_types=types[:layers], num_attention_heads=16,
            num_key_value_heads=4, head_dim=256, linear_num_key_heads=16,
            linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
            linear_conv_kernel_dim=4, tie_word_embeddings=True)
    if name == "nemotron-3-nano-4b":
        return tf.NemotronHConfig(
            vocab_size=131072, hidden_size=3136, intermediate_size=12544,
            hybrid_override_pattern=_NANO_4B_PATTERN[:layers], mamba_num_heads=96,
            mamba_head_dim=80, n_groups=8, ssm_state_size=128, conv_kernel=4, chunk_size=256,
            num_attention_heads=40, num_key_value_heads=8, head_dim=128,
            mlp_hidden_act="relu2")
    raise UnsupportedArchitecture(f"unknown shaped model {name!r}; known: "
                                  f"{', '.join(SHAPED_MODELS)}")


def shaped_model(name: str, layers: int | None = None, *, seed: int = 0,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16
                 ) -> tuple[torch.nn.Module, Any]:
    """``(model, tokenizer)``: a randomly initialised model with the real layer shapes of
    ``name`` (``qwen3.5-4b``, ``nemotron-3-nano-4b``) and its first ``layers`` layers, built
    directly on ``device``, so generation speed can be measured at full width without the
    weights. The tokenizer is the byte-level one: prompts are token ids."""
    from transformers import AutoModelForCausalLM

    n = SHAPED_MODELS.get(name, 1) if layers is None else int(layers)
    if n < 1:
        raise ValueError(f"layers must be >= 1, got {n}")
    config = _shaped_config(name, n)
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.config.name_or_path = f"{RANDOM_PREFIX}{name}"
    model.eval()
    return model, byte_tokenizer()
