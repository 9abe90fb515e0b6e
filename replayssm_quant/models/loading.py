"""Loading a model by name: a bundled fixture, a ``random:`` tiny model, a hub id or a local folder.

The architecture is checked from the config before any weights are read, and an unreachable hub
is detected in seconds, so a wrong name fails fast with one clear message.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch

from .fixture import FIXTURES, fixture
from .registry import architecture
from .tiny import RANDOM_PREFIX, tiny_model

__all__ = ["ModelUnavailable", "hub_offline", "hub_reachable", "load_model"]


class ModelUnavailable(OSError):
    """A model name that is neither a bundled fixture nor loadable (offline, typo)."""


def hub_offline() -> bool:
    """Whether the environment asks the Hugging Face libraries to stay offline."""
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_reachable(timeout: float = 3.0) -> bool:
    """One quick TCP connect to the hub endpoint, so an offline machine gets a clear answer in
    seconds rather than after the hub client's retries."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    parsed = urlparse(endpoint)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname or "huggingface.co", port),
                                      timeout=timeout):
            return True
    except OSError:
        return False


def load_model(name: str, *, device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, Any]:
    """``(model, tokenizer)`` for a bundled fixture name, a hub id or a local folder, in eval mode.

    The architecture is checked from the config before any weights are read, so an unsupported
    model fails in a second rather than after a download.
    """

    if name.startswith(RANDOM_PREFIX):
        model, tokenizer = tiny_model(name[len(RANDOM_PREFIX):])
        model.to(device=device, dtype=dtype)
        return model, tokenizer
    if name in FIXTURES:
        try:
            return fixture(name, device=device, dtype=dtype)
        except FileNotFoundError as exc:
            raise ModelUnavailable(str(exc)) from None
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if not Path(name).expanduser().exists() and not hub_offline() and not hub_reachable():
        raise ModelUnavailable(
            f"cannot load model {name!r}: not a local folder and the Hugging Face hub cannot be "
            f"contacted (offline?); bundled fixtures: {', '.join(FIXTURES)}; set "
            "HF_HUB_OFFLINE=1 to use the hub cache")
    try:
        config = AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as exc:
        raise ModelUnavailable(
            f"cannot load model {name!r}: {str(exc).splitlines()[0]} (bundled fixtures: "
            f"{', '.join(FIXTURES)}; or give a local folder)"
        ) from None
    architecture(config)
    try:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(name)
    except OSError as exc:
        raise ModelUnavailable(f"cannot load model {name!r}: {str(exc).splitlines()[0]}") from None
    model.to(device)
    model.eval()
    return model, tokenizer
