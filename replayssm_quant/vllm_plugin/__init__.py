"""vLLM general plugin: serve NemotronH (Mamba-2) and Qwen3-Next / Qwen3.5 (GDN) with the
precision split (high-precision checkpoint + low-precision read copy) on the project's kernels.

vLLM calls :func:`register` (entry point ``vllm.general_plugins``) once in every process. It
registers the plugin's model classes under the in-tree architecture names (imported lazily, in the
worker that builds the model) and a config-time check for those architectures. A model runs with
the plugin only when ``--additional-config`` has a ``replayssm_quant`` entry; see
``docs/vllm.md``. ``REPLAYSSM_QUANT_DISABLE=1`` turns the plugin off. Importing this package does
not import vLLM.
"""

from __future__ import annotations

import logging
import os

from .settings import ARCHITECTURES, CONFIG_KEY, GDN_ARCHITECTURES, MAMBA2_ARCHITECTURES

__all__ = ["ARCHITECTURES", "CONFIG_KEY", "DISABLE_ENV", "SUPPORTED_VLLM", "register"]

logger = logging.getLogger(__name__)

DISABLE_ENV = "REPLAYSSM_QUANT_DISABLE"
SUPPORTED_VLLM = ">=0.33,<0.34"

_MODEL_CLASSES = {
    "NemotronHForCausalLM": "mamba2:ReplaySSMNemotronHForCausalLM",
    "NemotronHPuzzleForCausalLM": "mamba2:ReplaySSMNemotronHForCausalLM",
    "Qwen3NextForCausalLM": "gdn:ReplaySSMQwen3NextForCausalLM",
    "Qwen3_5ForCausalLM": "gdn:ReplaySSMQwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM": "gdn:ReplaySSMQwen3_5MoeForCausalLM",
    "Qwen3_5ForConditionalGeneration": "gdn:ReplaySSMQwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration": "gdn:ReplaySSMQwen3_5MoeForConditionalGeneration",
}
assert set(_MODEL_CLASSES) == set(MAMBA2_ARCHITECTURES + GDN_ARCHITECTURES)

_registered = False


def disabled() -> bool:
    return os.environ.get(DISABLE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def check_vllm_version(version: str) -> None:
    """Fail loudly outside the tested vLLM series: the plugin hooks private names."""
    from packaging.version import InvalidVersion, Version

    try:
        v = Version(version)
    except InvalidVersion:
        v = None
    if v is None or not (Version("0.33") <= Version(v.base_version) < Version("0.34")):
        raise RuntimeError(
            f"replayssm_quant's vLLM plugin supports vllm{SUPPORTED_VLLM}, found vllm "
            f"{version}. Install vllm==0.33.0, or set {DISABLE_ENV}=1 to run vLLM without the "
            f"plugin.")


def _wrap_config_checks() -> None:
    """Run the plugin's config check after vLLM's own per-architecture config hook."""
    from vllm.model_executor.models import config as model_configs

    from .settings import validate

    table = model_configs.MODELS_CONFIG_MAP
    for arch in ARCHITECTURES:
        base = table.get(arch, model_configs.VerifyAndUpdateConfig)
        if getattr(base, "_replayssm_quant_check", False):
            continue

        def verify(vllm_config, _base=base) -> None:
            _base.verify_and_update_config(vllm_config)
            validate(vllm_config)

        table[arch] = type(f"ReplaySSMQuant{base.__name__}", (base,), {
            "_replayssm_quant_check": True,
            "verify_and_update_config": staticmethod(verify),
            "__doc__": f"{base.__name__}, then the replayssm_quant config check.",
        })


def register() -> None:
    """The ``vllm.general_plugins`` entry point (idempotent)."""
    global _registered
    if disabled():
        logger.info("replayssm_quant vLLM plugin disabled by %s", DISABLE_ENV)
        return
    if _registered:
        return
    import vllm
    from vllm import ModelRegistry

    check_vllm_version(vllm.__version__)
    for arch, target in _MODEL_CLASSES.items():
        ModelRegistry.register_model(arch, f"{__name__}.{target}")
    _wrap_config_checks()
    _registered = True
