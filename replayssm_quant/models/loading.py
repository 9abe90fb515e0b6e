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
from .tiny import RANDOM_PREFIX, SHAPED_MODELS, shaped_model, tiny_model
from .window import apply_attention_window

__all__ = ["DEVICE_MAP_STRATEGIES", "DeviceMapError", "ModelUnavailable", "check_model",
           "check_weights", "hub_offline", "hub_reachable", "load_model", "module_device",
           "output_device", "parse_device_map", "place_model", "resolve_device_map",
           "ssm_layer_devices"]


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
        if name[len(RANDOM_PREFIX):] not in SHAPED_MODELS:
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
               dtype: torch.dtype = torch.float32,
               device_map: str | dict | None = None) -> tuple[torch.nn.Module, Any]:
    """``(model, tokenizer)`` for a bundled fixture name, a hub id or a local folder, in eval mode.

    The architecture is checked from the config before any weights are read, so an unsupported
    model fails in a second rather than after a download. ``device_map`` (Hugging Face /
    accelerate semantics, :func:`parse_device_map`) spreads the layers over several devices
    instead of moving the model to ``device``; a ``device`` that is itself a device-map spec
    (``balanced``, a JSON object) counts as one.
    """
    if device_map is None and is_device_map(device):
        device_map = str(device)
    if device_map is not None:
        return _load_mapped(name, parse_device_map(device_map), dtype)
    if name.startswith(RANDOM_PREFIX) and name[len(RANDOM_PREFIX):] in SHAPED_MODELS:
        return shaped_model(name[len(RANDOM_PREFIX):], device=device, dtype=dtype)
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
        model = apply_attention_window(AutoModelForCausalLM.from_pretrained(name, dtype=dtype))
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


# ----------------------------------------------------------------------------------- device maps
DEVICE_MAP_STRATEGIES: tuple[str, ...] = ("auto", "balanced", "balanced_low_0", "sequential")
"""accelerate's placement strategies (``auto`` is ``balanced``, as in ``from_pretrained``)."""

_MAP_DEVICE_TYPES = ("cpu", "cuda")


class DeviceMapError(ValueError):
    """A device map that cannot place the model (bad JSON, an unknown device, a gap)."""


def is_device_map(device: object) -> bool:
    """Whether a ``device`` string is a device-map spec rather than one torch device."""
    if not isinstance(device, str):
        return False
    t = device.strip()
    return t in DEVICE_MAP_STRATEGIES[1:] or t.startswith("{") or t.endswith(".json")


def _cuda_count() -> int:
    return torch.cuda.device_count()


def _map_device(module: str, value: object) -> int | str:
    """One value of a JSON map: a GPU index or ``cpu`` / ``cuda`` / ``cuda:N`` that exists here."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise DeviceMapError(f"--device-map: {module!r} maps to {value!r}; use a GPU index, "
                             "'cpu' or 'cuda:N'")
    try:
        dev = torch.device("cuda", value) if isinstance(value, int) else torch.device(value)
    except (RuntimeError, ValueError):
        raise DeviceMapError(f"--device-map: {module!r} maps to unknown device {value!r}; use a "
                             "GPU index, 'cpu' or 'cuda:N'") from None
    if dev.type not in _MAP_DEVICE_TYPES:
        raise DeviceMapError(f"--device-map: {module!r} maps to device {value!r}; only GPU "
                             "indices, 'cpu' and 'cuda:N' place layers")
    if dev.type == "cuda":
        index = dev.index or 0
        if index >= _cuda_count():
            raise DeviceMapError(f"--device-map: {module!r} maps to GPU {index}, but "
                                 f"{_cuda_count()} GPU(s) are visible")
        return index
    return "cpu"


def parse_device_map(spec: str | dict | Path) -> str | dict[str, int | str]:
    """A ``--device-map`` value checked for syntax and devices: a strategy name
    (:data:`DEVICE_MAP_STRATEGIES`), or a JSON object (inline or a ``.json`` file) mapping module
    names to devices. Whether the map covers a model is checked by :func:`resolve_device_map`."""
    if isinstance(spec, dict):
        raw: Any = spec
    else:
        text = str(spec).strip()
        if text in DEVICE_MAP_STRATEGIES:
            return text
        if text.startswith(("{", "[")):
            source = "--device-map"
        elif text.endswith(".json") or Path(text).expanduser().is_file():
            path = Path(text).expanduser()
            if not path.is_file():
                raise DeviceMapError(f"--device-map {text}: no such file")
            source, text = str(path), path.read_text()
        else:
            raise DeviceMapError(f"--device-map {spec!r}: use {', '.join(DEVICE_MAP_STRATEGIES)}, "
                                 "a JSON object of module -> device, or a .json file of one")
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise DeviceMapError(f"{source} is not valid JSON ({exc})") from None
    if not isinstance(raw, dict) or not raw:
        raise DeviceMapError("--device-map: a JSON map must be a non-empty object of "
                             "module name -> device")
    return {str(k): _map_device(str(k), v) for k, v in raw.items()}


def _covering_key(name: str, device_map: dict[str, Any]) -> str | None:
    """The longest key of ``device_map`` that is ``name`` or a module above it."""
    best = None
    for key in device_map:
        if key == "" or name == key or name.startswith(key + "."):
            if best is None or len(key) > len(best):
                best = key
    return best


def _check_covers(model: torch.nn.Module, device_map: dict[str, int | str]) -> None:
    modules = {n for n, _ in model.named_modules()}
    unknown = [k for k in device_map if k and k not in modules]
    if unknown:
        raise DeviceMapError(f"--device-map names module(s) the model does not have: "
                             f"{', '.join(unknown[:5])}")
    tensors = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
    gaps = [n for n in tensors if _covering_key(n, device_map) is None]
    if gaps:
        raise DeviceMapError(f"--device-map does not cover {len(gaps)} weight(s) of the model, "
                             f"e.g. {gaps[0]}; map a module above it")


def resolve_device_map(model: torch.nn.Module, spec: str | dict[str, int | str], *,
                       dtype: torch.dtype | None = None,
                       max_memory: dict[int | str, int | str] | None = None
                       ) -> dict[str, int | str]:
    """The module -> device map that ``spec`` gives ``model`` (real or on the meta device).

    A strategy asks accelerate (``balanced`` spreads the layers evenly over the GPUs, whole
    decoder blocks per device); a JSON map must cover every weight and name only real modules.
    """
    if isinstance(spec, dict):
        _check_covers(model, spec)
        return dict(spec)
    from accelerate import infer_auto_device_map
    from accelerate.utils import get_balanced_memory, get_max_memory

    no_split = sorted(getattr(model, "_no_split_modules", None) or ())
    if spec == "sequential":
        memory = get_max_memory(max_memory)
    else:
        memory = get_balanced_memory(model, max_memory=max_memory, no_split_module_classes=no_split,
                                     dtype=dtype, low_zero=spec == "balanced_low_0")
    return dict(infer_auto_device_map(model, max_memory=memory, no_split_module_classes=no_split,
                                      dtype=dtype))


def place_model(model: torch.nn.Module, spec: str | dict[str, int | str], *,
                dtype: torch.dtype | None = None) -> torch.nn.Module:
    """Spread a loaded model over devices per ``spec`` (accelerate's ``dispatch_model``: each
    module's inputs move to its device, nothing is gathered on the first GPU)."""
    from accelerate import dispatch_model

    device_map = resolve_device_map(model, spec, dtype=dtype)
    dispatch_model(model, device_map=device_map)
    model.hf_device_map = device_map
    return model


def module_device(module: torch.nn.Module) -> torch.device:
    """Where ``module`` computes: the device of its first weight (or buffer)."""
    for t in module.parameters():
        return t.device
    for t in module.buffers():
        return t.device
    return torch.device("cpu")


def output_device(model: torch.nn.Module) -> torch.device:
    """The device of the decoder's final hidden states (its last weight: the final norm)."""
    weights = list(model.get_decoder().parameters())
    return weights[-1].device if weights else module_device(model)


def ssm_layer_devices(model: torch.nn.Module,
                      device_map: dict[str, int | str] | None = None) -> dict[int, torch.device]:
    """Layer index -> the device of each SSM mixer: from ``device_map`` when given (what a map
    says before anything runs), else from the mixer's own weights."""
    from .registry import ssm_layers

    out: dict[int, torch.device] = {}
    for s in ssm_layers(model):
        if device_map is None:
            out[s.layer] = module_device(s.module)
            continue
        key = _covering_key(s.name, device_map)
        if key is None:
            raise DeviceMapError(f"--device-map does not place SSM layer {s.name}")
        value = device_map[key]
        out[s.layer] = torch.device("cuda", value) if isinstance(value, int) else \
            torch.device(value)
    return out


def _load_mapped(name: str, spec: str | dict[str, int | str],
                 dtype: torch.dtype) -> tuple[torch.nn.Module, Any]:
    """:func:`load_model` with a device map: in-memory models (fixtures, ``random:``) are
    dispatched after loading; hub and local checkpoints load each weight straight onto its
    device (``from_pretrained(device_map=...)``)."""
    if name.startswith(RANDOM_PREFIX) or name in FIXTURES:
        model, tokenizer = load_model(name, device="cpu", dtype=dtype)
        return place_model(model, spec, dtype=dtype), tokenizer
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if not Path(name).expanduser().exists() and not hub_offline() and not hub_reachable():
        raise ModelUnavailable(_unreachable(name))
    try:
        config = AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as exc:
        raise ModelUnavailable(f"cannot load model {name!r}: {str(exc).splitlines()[0]}") from None
    architecture(config)
    if isinstance(spec, dict):
        with init_empty_weights():
            _check_covers(AutoModelForCausalLM.from_config(config), spec)
    try:
        model = apply_attention_window(
            AutoModelForCausalLM.from_pretrained(name, dtype=dtype, device_map=spec))
        tokenizer = AutoTokenizer.from_pretrained(name)
    except OSError as exc:
        raise ModelUnavailable(f"cannot load model {name!r}: {str(exc).splitlines()[0]}") from None
    model.eval()
    return model, tokenizer
