"""The plugin's configuration: read from ``--additional-config``, checked once at config time.

``{"replayssm_quant": "<config>"}`` where ``<config>`` is a preset name or the string form of
:func:`replayssm_quant.precision.parse_config`; or ``{"replayssm_quant": {"config": "<config>",
"seed": 7}}``; or the string-form keys spelled out (the dotted CLI form,
``--additional-config.replayssm_quant.ckpt fp8:sr --additional-config.replayssm_quant.read
nvfp4``). ``L`` comes from ``--replayssm-buffer-len``: configs that replay need
``--use-replayssm``, conventional ones (``L=1``) must not use it.

Everything here reads the vLLM config by attribute only, so it imports no vLLM.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..precision import PRESETS, PrecisionConfig, parse_config
from .layout import with_buffer_len

__all__ = [
    "ARCHITECTURES",
    "CONFIG_KEY",
    "PluginSettings",
    "parse_additional_config",
    "settings_for",
    "validate",
]

CONFIG_KEY = "replayssm_quant"

MAMBA2_ARCHITECTURES = ("NemotronHForCausalLM", "NemotronHPuzzleForCausalLM")
GDN_ARCHITECTURES = (
    "Qwen3NextForCausalLM",
    "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
)
ARCHITECTURES = MAMBA2_ARCHITECTURES + GDN_ARCHITECTURES

_STRING_KEYS = ("ckpt", "read", "L", "prefill")


class ConfigError(ValueError):
    """A configuration the plugin cannot serve; the message says what to change."""


@dataclass(frozen=True)
class PluginSettings:
    """What one model runs with: the precision config (``L`` from vLLM) and the SR seed."""

    config: PrecisionConfig
    seed: int
    kind: str  # "mamba2" or "gdn"


def _explicit_l(text: str) -> int | None:
    """The ``L=`` value written in a config string, if any (presets carry none)."""
    for item in text.split(","):
        if "=" in item:
            k, v = (p.strip() for p in item.split("=", 1))
            if k.lower() == "l" and re.fullmatch(r"[+-]?\d+", v):
                return int(v)
    return None


def parse_additional_config(raw: Any) -> tuple[str, int]:
    """``additional_config["replayssm_quant"]`` -> (config string, seed)."""
    if isinstance(raw, str):
        return raw, 0
    if not isinstance(raw, dict):
        raise ConfigError(f"{CONFIG_KEY} must be a config string or a mapping, got "
                          f"{type(raw).__name__}")
    unknown = set(raw) - {"config", "seed", *_STRING_KEYS, "l"}
    if unknown:
        raise ConfigError(f"unknown {CONFIG_KEY} keys {sorted(unknown)}; use 'config' (a preset "
                          f"or 'ckpt=..,read=..,L=..'), 'seed', or the keys {_STRING_KEYS}")
    seed = raw.get("seed", 0)
    if isinstance(seed, str) and seed.strip().isdigit():
        seed = int(seed)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ConfigError(f"{CONFIG_KEY}.seed must be an integer in [0, 2^63), got {seed!r}")
    spelled = [k for k in raw if k not in ("config", "seed")]
    if "config" in raw and spelled:
        raise ConfigError(f"give either {CONFIG_KEY}.config or the keys {spelled}, not both")
    if "config" in raw:
        if not isinstance(raw["config"], str):
            raise ConfigError(f"{CONFIG_KEY}.config must be a string")
        return raw["config"], seed
    if not spelled:
        raise ConfigError(f"{CONFIG_KEY} is empty; give a preset or 'ckpt=..,read=..'")
    return ",".join(f"{k}={raw[k]}" for k in spelled), seed


def _kind(architecture: str | None) -> str | None:
    if architecture in MAMBA2_ARCHITECTURES:
        return "mamba2"
    if architecture in GDN_ARCHITECTURES:
        return "gdn"
    return None


def _raw(vllm_config: Any) -> Any:
    extra = getattr(vllm_config, "additional_config", None) or {}
    return extra.get(CONFIG_KEY) if isinstance(extra, dict) else None


def settings_for(vllm_config: Any) -> PluginSettings | None:
    """The settings for this model, or None when the plugin is not enabled for it (no
    ``replayssm_quant`` entry, or an architecture the plugin does not cover). Raises
    :class:`ConfigError` for a config it cannot serve."""
    raw = _raw(vllm_config)
    model_config = getattr(vllm_config, "model_config", None)
    kind = _kind(getattr(model_config, "architecture", None))
    if raw is None or kind is None:
        return None
    text, seed = parse_additional_config(raw)
    cache = vllm_config.cache_config
    use_replay = bool(getattr(cache, "use_replayssm", False))
    L = int(getattr(cache, "replayssm_buffer_len", 16))
    preset = text.strip() in PRESETS
    written_l = None if preset else _explicit_l(text)
    spelled = "=" in text and not preset
    to_parse = f"{text},L={L}" if (spelled and use_replay and written_l is None) else text
    try:
        cfg = parse_config(to_parse)
    except ValueError as e:
        hint = ("" if use_replay else " (a read copy needs ReplaySSM: add --use-replayssm, "
                "L comes from --replayssm-buffer-len)")
        raise ConfigError(f"{CONFIG_KEY}: {e}{hint}") from None
    if use_replay:
        if L < 2:
            raise ConfigError("--use-replayssm with --replayssm-buffer-len 1 never replays: "
                              "use a conventional config (L=1) without --use-replayssm")
        if written_l is not None and written_l != L:
            raise ConfigError(f"{CONFIG_KEY} says L={written_l} but --replayssm-buffer-len is "
                              f"{L}; L comes from --replayssm-buffer-len: drop L= or make "
                              f"them equal")
        if cfg.conventional:
            raise ConfigError(f"{CONFIG_KEY} config {cfg.label!r} is conventional decoding "
                              f"(L=1): serve it without --use-replayssm")
        try:
            cfg = with_buffer_len(cfg, L)
        except ValueError as e:
            raise ConfigError(f"{CONFIG_KEY}: {e}") from None
    elif cfg.L > 1:
        raise ConfigError(f"{CONFIG_KEY} config {cfg.label!r} replays (L={cfg.L}): add "
                          f"--use-replayssm (L is taken from --replayssm-buffer-len)")
    return PluginSettings(cfg, int(seed), kind)


def validate(vllm_config: Any) -> PluginSettings | None:
    """Reject, at config time, every combination the plugin cannot serve (one message each)."""
    model_config = vllm_config.model_config
    kind = _kind(getattr(model_config, "architecture", None))
    cache = vllm_config.cache_config
    raw = _raw(vllm_config)
    if raw is None:
        if kind == "gdn" and getattr(cache, "use_replayssm", False):
            raise ConfigError(
                f"--use-replayssm on {model_config.architecture} runs the replayssm_quant GDN "
                f"kernels and needs their config: add --additional-config "
                f"'{{\"{CONFIG_KEY}\": \"nvfp4-read/fp32\"}}' (or another preset)")
        return None
    settings = settings_for(vllm_config)
    if settings is None:
        return None
    if getattr(cache, "enable_prefix_caching", False) or \
            getattr(cache, "mamba_cache_mode", "none") == "align":
        raise ConfigError(
            "prefix caching (mamba_cache_mode='align') copies only the conv and ssm states "
            "between blocks, so the read copy, scales and ring would go stale: serve with "
            "--no-enable-prefix-caching")
    if getattr(vllm_config, "speculative_config", None) is not None:
        raise ConfigError("speculative decoding is not supported yet (the verify and commit "
                          "kernels are not wired into vLLM): drop --speculative-config")
    if getattr(vllm_config, "kv_transfer_config", None) is not None:
        raise ConfigError("KV connectors (P/D disaggregation, KV offload) move only vLLM's own "
                          "state tensors, not the checkpoint scales, read copy or ring: drop "
                          "--kv-transfer-config")
    mamba = getattr(vllm_config, "mamba_config", None)
    backend = getattr(getattr(mamba, "backend", None), "name", "TRITON")
    if settings.kind == "mamba2" and backend != "TRITON":
        raise ConfigError("the plugin replaces the Triton Mamba-2 decode path: use "
                          "--mamba-backend triton")
    if getattr(mamba, "enable_stochastic_rounding", False):
        raise ConfigError("--enable-mamba-cache-stochastic-rounding is vLLM's own FP16 SR; the "
                          "plugin rounds its checkpoint itself (e.g. ckpt=fp16:sr): drop the flag")
    if getattr(vllm_config, "use_v2_model_runner", False):
        raise ConfigError("the plugin drives the V1 model runner's Mamba metadata: set "
                          "VLLM_USE_V2_MODEL_RUNNER=0")
    hf = getattr(model_config, "hf_text_config", None) or model_config.hf_config
    d = getattr(hf, "ssm_state_size" if settings.kind == "mamba2" else "linear_key_head_dim",
                None)
    if d is not None:
        from .layout import _check_row_length

        try:
            _check_row_length(settings.config, settings.kind, int(d))
        except ValueError as e:
            raise ConfigError(f"{model_config.architecture}: {e}") from None
    return settings
