"""Loading a model by name: a bundled fixture, a ``random:`` tiny model, a hub id or a local folder.

The architecture is checked from the config before any weights are read, and an unreachable hub
is detected in seconds, so a wrong name fails fast with one clear message.
"""

from __future__ import annotations

import json
import os
import socket
import struct
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch

from .fixture import FIXTURES, fixture, fixture_path
from .registry import architecture
from .tiny import RANDOM_PREFIX, tiny_model

__all__ = ["ModelUnavailable", "check_model", "check_weights", "hub_offline", "hub_reachable",
           "load_model"]


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


_REEXPORT = "re-download or re-export it"


def check_weights(folder: str | Path) -> None:
    """Every ``*.safetensors`` file of ``folder`` holds the bytes its header promises.

    Reads only the headers, so a truncated or damaged download fails here in milliseconds with
    the file named, not inside the loader with a bare ``incomplete metadata``.
    """
    for path in sorted(Path(folder).expanduser().glob("*.safetensors")):
        size = path.stat().st_size
        try:
            with open(path, "rb") as fh:
                head = fh.read(8)
                if len(head) < 8:
                    raise ValueError(f"{size} bytes, shorter than the 8-byte header length")
                (n,) = struct.unpack("<Q", head)
                if n > size - 8:
                    raise ValueError(f"the header claims {n:,} bytes but the file has {size:,}")
                header = json.loads(fh.read(n))
            end = max((int(v["data_offsets"][1]) for k, v in header.items()
                       if k != "__metadata__"), default=0)
            if 8 + n + end != size:
                raise ValueError(f"the tensors need {8 + n + end:,} bytes but the file has "
                                 f"{size:,}")
        except (ValueError, KeyError, TypeError, IndexError, UnicodeDecodeError) as exc:
            raise ModelUnavailable(f"corrupt weights file {path}: {exc} (truncated download?); "
                                   f"{_REEXPORT}") from None
        except OSError as exc:
            raise ModelUnavailable(f"cannot read weights file {path}: {exc.strerror or exc}"
                                   ) from None


def check_model(name: str) -> None:
    """The cheap checks of :func:`load_model` without loading: a fixture or a local folder must
    have a supported config and intact weights; a hub id needs a reachable (or cached) hub.

    Commands call it before long work so a bad model fails in a second.
    """
    from types import SimpleNamespace

    if name.startswith(RANDOM_PREFIX):
        architecture(SimpleNamespace(model_type=name[len(RANDOM_PREFIX):]))
        return
    if name in FIXTURES:
        try:
            folder = fixture_path(name)
        except FileNotFoundError as exc:
            raise ModelUnavailable(str(exc)) from None
        check_weights(folder)
        return
    local = Path(name).expanduser()
    if local.exists():
        if not local.is_dir() or not (local / "config.json").is_file():
            raise ModelUnavailable(f"cannot load model {name!r}: a model is a folder with a "
                                   f"config.json (bundled fixtures: {', '.join(FIXTURES)})")
        try:
            config = json.loads((local / "config.json").read_text())
        except (OSError, ValueError) as exc:
            raise ModelUnavailable(f"{local / 'config.json'} is not readable JSON ({exc}); "
                                   f"{_REEXPORT}") from None
        architecture(SimpleNamespace(model_type=config.get("model_type")))
        check_weights(local)
        return
    if not hub_offline() and not hub_reachable():
        raise ModelUnavailable(_unreachable(name))


def _unreachable(name: str) -> str:
    return (f"cannot load model {name!r}: not a local folder and the Hugging Face hub cannot be "
            f"contacted (offline?); bundled fixtures: {', '.join(FIXTURES)}; set "
            "HF_HUB_OFFLINE=1 to use the hub cache")


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
            check_weights(fixture_path(name))
            return fixture(name, device=device, dtype=dtype)
        except FileNotFoundError as exc:
            raise ModelUnavailable(str(exc)) from None
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if not Path(name).expanduser().exists() and not hub_offline() and not hub_reachable():
        raise ModelUnavailable(_unreachable(name))
    if Path(name).expanduser().is_dir():
        check_weights(Path(name).expanduser())
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
    except Exception as exc:  # safetensors' own error type for a damaged file
        if type(exc).__name__ != "SafetensorError":
            raise
        raise ModelUnavailable(f"cannot load model {name!r}: damaged weights ("
                               f"{str(exc).splitlines()[0]}); {_REEXPORT}") from None
    model.to(device)
    model.eval()
    return model, tokenizer
