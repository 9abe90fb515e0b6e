"""Adapters onto Hugging Face hybrid models: load one, find its SSM mixers, and patch their scans.

A teacher-forced drift measurement needs the whole sequence to go through the model once, with
every SSM layer behaving as it would in a decode loop under a precision config. Reimplementing
each mixer would drift away from the upstream model code, so the adapters keep the model's own
``forward`` (projections, convolution, gating, norms) and replace only the module-level chunked
scan it calls: the first ``prefill`` tokens still go through the model's exact chunked scan, and
the remaining tokens go through the config's decode emulation
(:func:`replayssm_quant.kernels.emulate_mamba2` / :func:`~replayssm_quant.kernels.emulate_gdn`)
starting from the prefill's final state. Attention, MLP, norms and the LM head are untouched.
"""

from __future__ import annotations

import contextvars
import importlib
import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
import torch.nn.functional as F

from ..precision import ModelShape, PrecisionConfig, parse_config

__all__ = [
    "ARCHITECTURES",
    "DecayRecorder",
    "ModelPatch",
    "ModelUnavailable",
    "SSMLayer",
    "UnsupportedArchitecture",
    "architecture",
    "decoder_hidden_states",
    "hub_offline",
    "hub_reachable",
    "lm_head_logits",
    "load_model",
    "model_shape",
    "patch_model",
    "ssm_layers",
    "tiny_model",
]


@dataclass(frozen=True)
class Architecture:
    """Where one model family keeps its SSM mixer and the chunked scan that mixer calls."""

    kind: str  # "mamba2" or "gdn"
    module: str  # transformers modeling module
    mixer: str  # mixer class name in that module
    scan: str  # module-level chunked-scan function the mixer's forward calls


_NEMOTRON_H = Architecture("mamba2", "transformers.models.nemotron_h.modeling_nemotron_h",
                           "NemotronHMamba2Mixer", "mamba2_chunk_scan")
_MAMBA2 = Architecture("mamba2", "transformers.models.mamba2.modeling_mamba2", "Mamba2Mixer",
                       "mamba2_chunk_scan")
_QWEN3_5 = Architecture("gdn", "transformers.models.qwen3_5.modeling_qwen3_5",
                        "Qwen3_5GatedDeltaNet", "torch_chunk_gated_delta_rule")
_QWEN3_5_MOE = Architecture("gdn", "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
                            "Qwen3_5MoeGatedDeltaNet", "torch_chunk_gated_delta_rule")
_QWEN3_NEXT = Architecture("gdn", "transformers.models.qwen3_next.modeling_qwen3_next",
                           "Qwen3NextGatedDeltaNet", "torch_chunk_gated_delta_rule")

ARCHITECTURES: dict[str, Architecture] = {
    "nemotron_h": _NEMOTRON_H,
    "mamba2": _MAMBA2,
    "qwen3_5": _QWEN3_5,
    "qwen3_5_text": _QWEN3_5,
    "qwen3_5_moe": _QWEN3_5_MOE,
    "qwen3_5_moe_text": _QWEN3_5_MOE,
    "qwen3_next": _QWEN3_NEXT,
}
"""Supported ``config.model_type`` values (Mamba-2: NemotronH, Mamba2; GDN: Qwen3.5 dense and
MoE, text-only or with the vision tower, and Qwen3-Next)."""


class UnsupportedArchitecture(ValueError):
    """The model has no SSM mixer this package knows how to emulate."""


class ModelUnavailable(OSError):
    """A model name that is neither a bundled fixture nor loadable (offline, typo)."""


def _supported_text() -> str:
    return ", ".join(sorted(ARCHITECTURES))


def architecture(model_or_config: Any) -> Architecture:
    """The :class:`Architecture` of a model or config; one clear error if it has none."""
    config = getattr(model_or_config, "config", model_or_config)
    model_type = getattr(config, "model_type", None)
    if model_type not in ARCHITECTURES:
        raise UnsupportedArchitecture(
            f"unsupported architecture {model_type!r}: replayssm-quant emulates the SSM layers of "
            f"model types {_supported_text()}"
        )
    return ARCHITECTURES[model_type]


# ----------------------------------------------------------------------------------- layers
@dataclass(frozen=True)
class SSMLayer:
    """One SSM mixer of a loaded model, with its decode shape.

    mamba2: ``heads`` x ``head_dim`` (P) x ``d_state`` (N), ``groups`` B/C groups.
    gdn: ``heads`` value heads x ``head_dim`` (d_v) x ``d_state`` (d_k), ``groups`` key heads.
    ``layer`` is the model's layer index, the ``layer`` key of stochastic rounding.
    """

    layer: int
    name: str
    kind: str
    heads: int
    head_dim: int
    d_state: int
    groups: int
    module: torch.nn.Module = field(repr=False, compare=False)


def _mixer_class(arch: Architecture) -> type:
    return getattr(importlib.import_module(arch.module), arch.mixer)


def ssm_layers(model: torch.nn.Module) -> list[SSMLayer]:
    """Every SSM mixer of ``model`` in layer order (raises for unsupported models)."""
    arch = architecture(model)
    cls = _mixer_class(arch)
    layers: list[SSMLayer] = []
    for name, mod in model.named_modules():
        if not isinstance(mod, cls):
            continue
        if arch.kind == "mamba2":
            dims = (mod.num_heads, mod.head_dim, mod.ssm_state_size, mod.n_groups)
        else:
            dims = (mod.num_v_heads, mod.head_v_dim, mod.head_k_dim, mod.num_k_heads)
        layers.append(SSMLayer(int(mod.layer_idx), name, arch.kind, *dims, module=mod))
    if not layers:
        raise UnsupportedArchitecture(
            f"model {type(model).__name__} has no {arch.mixer} layer; nothing to emulate"
        )
    return sorted(layers, key=lambda s: s.layer)


def model_shape(model: torch.nn.Module, name: str | None = None) -> ModelShape:
    """The per-layer SSM decode shape of ``model`` for the cost model (all its SSM layers share it).

    ``act_bytes`` is the element size of the model's parameters: the ring stores activations
    in the compute dtype.
    """
    layers = ssm_layers(model)
    first = layers[0]
    dims = {(s.kind, s.heads, s.head_dim, s.d_state, s.groups) for s in layers}
    if len(dims) > 1:
        raise ValueError(f"SSM layers of {type(model).__name__} differ in shape: {sorted(dims)}")
    label = name or str(getattr(model.config, "name_or_path", "") or type(model).__name__)
    act_bytes = next(model.parameters()).element_size()
    return ModelShape(label, first.kind, first.heads, first.head_dim, first.d_state, first.groups,
                      layers=len(layers), act_bytes=act_bytes)


# ----------------------------------------------------------------------------------- loading
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
    from .fixture import FIXTURES, fixture

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
        f"model types {_supported_text()}")


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


# ----------------------------------------------------------------------------------- forward
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


# ----------------------------------------------------------------------------------- decay
class DecayRecorder:
    """Mean per-token decay of every SSM head over the evaluated text.

    A head's decay ``a_t`` (Mamba-2: ``exp(dt_t A)``, GDN: ``exp(g_t)``) sets how long rounding
    error in its state lives: shared narrow states hurt long-memory heads (``a`` near 1) most,
    so drift reports show the spectrum beside the KL.
    """

    def __init__(self) -> None:
        self.kinds: dict[int, str] = {}
        self.sums: dict[int, torch.Tensor] = {}
        self.log_sums: dict[int, torch.Tensor] = {}
        self.counts: dict[int, int] = {}

    def add(self, layer: int, kind: str, decay: torch.Tensor) -> None:
        """Accumulate ``decay (B, T, H)``."""
        d = decay.detach().double().flatten(0, -2)
        s, ls = d.sum(0).cpu(), d.clamp_min(1e-300).log().sum(0).cpu()
        if layer in self.sums:
            self.sums[layer] += s
            self.log_sums[layer] += ls
            self.counts[layer] += d.shape[0]
        else:
            self.kinds[layer], self.sums[layer], self.log_sums[layer] = kind, s, ls
            self.counts[layer] = d.shape[0]

    def merge(self, other: DecayRecorder) -> None:
        for layer in other.sums:
            if layer in self.sums:
                self.sums[layer] += other.sums[layer]
                self.log_sums[layer] += other.log_sums[layer]
                self.counts[layer] += other.counts[layer]
            else:
                self.kinds[layer] = other.kinds[layer]
                self.sums[layer] = other.sums[layer].clone()
                self.log_sums[layer] = other.log_sums[layer].clone()
                self.counts[layer] = other.counts[layer]

    def state_dict(self) -> dict:
        return {str(k): {"kind": self.kinds[k], "sum": self.sums[k].tolist(),
                         "log_sum": self.log_sums[k].tolist(), "count": self.counts[k]}
                for k in sorted(self.sums)}

    @classmethod
    def from_state_dict(cls, state: dict) -> DecayRecorder:
        rec = cls()
        for k, v in state.items():
            layer = int(k)
            rec.kinds[layer] = v["kind"]
            rec.sums[layer] = torch.tensor(v["sum"], dtype=torch.float64)
            rec.log_sums[layer] = torch.tensor(v["log_sum"], dtype=torch.float64)
            rec.counts[layer] = int(v["count"])
        return rec

    def spectrum(self, thresholds: tuple[float, ...] = (0.99, 0.999)) -> dict:
        """Per layer and head: mean decay, geometric-mean decay and memory ``1 / (1 - mean)``
        in tokens, plus the fraction of heads at or above each threshold."""
        layers = []
        all_means: list[float] = []
        for layer in sorted(self.sums):
            n = max(self.counts[layer], 1)
            mean = (self.sums[layer] / n).tolist()
            geo = (self.log_sums[layer] / n).exp().tolist()
            all_means += mean
            layers.append({
                "layer": layer, "kind": self.kinds[layer], "tokens": self.counts[layer],
                "mean_decay": mean, "geomean_decay": geo,
                "memory_tokens": [1.0 / max(1.0 - m, 1e-12) for m in mean],
                "max_mean_decay": max(mean) if mean else None,
            })
        frac = {f">={t:g}": (sum(m >= t for m in all_means) / len(all_means) if all_means else 0.0)
                for t in thresholds}
        return {"layers": layers, "heads": len(all_means), "fraction_of_heads": frac,
                "max_mean_decay": max(all_means) if all_means else None}


# ----------------------------------------------------------------------------------- patching
@dataclass
class _Active:
    patch: ModelPatch
    layer: SSMLayer


_CURRENT: contextvars.ContextVar[_Active | None] = contextvars.ContextVar(
    "replayssm_current_mixer", default=None)
_INSTALL_LOCK = threading.Lock()
_INSTALLED: dict[tuple[str, str], list] = {}  # (module, fn) -> [original, replacement, refcount]


def _mamba2_args(hidden_states, dt, A, B, C, chunk_size=None, D=None, dt_bias=None,
                 initial_states=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                 return_final_states=False, **kwargs) -> dict:
    """Name the arguments of a ``mamba2_chunk_scan`` call whichever way they were passed."""
    if chunk_size is not None:
        kwargs["chunk_size"] = chunk_size
    return dict(hidden_states=hidden_states, dt=dt, A=A, B=B, C=C, D=D, dt_bias=dt_bias,
                initial_states=initial_states, dt_softplus=dt_softplus, dt_limit=dt_limit,
                return_final_states=return_final_states, extra=kwargs)


def _gdn_args(query, key, value, g, beta, chunk_size=None, initial_state=None,
              output_final_state=False, use_qk_l2norm_in_kernel=False, **kwargs) -> dict:
    """Name the arguments of a ``torch_chunk_gated_delta_rule`` call."""
    if chunk_size is not None:
        kwargs["chunk_size"] = chunk_size
    return dict(query=query, key=key, value=value, g=g, beta=beta, initial_state=initial_state,
                output_final_state=output_final_state,
                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, extra=kwargs)


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """The L2 normalisation of the transformers GDN scans (and of FLA)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _make_scan(original):
    def scan(*args, **kwargs):
        active = _CURRENT.get()
        if active is None:
            return original(*args, **kwargs)
        return active.patch._scan(active.layer, original, args, kwargs)

    scan.__wrapped__ = original
    scan.__name__ = getattr(original, "__name__", "scan")
    scan.__doc__ = getattr(original, "__doc__", None)
    return scan


def _install(arch: Architecture) -> None:
    key = (arch.module, arch.scan)
    with _INSTALL_LOCK:
        if key in _INSTALLED:
            _INSTALLED[key][2] += 1
            return
        mod = importlib.import_module(arch.module)
        original = getattr(mod, arch.scan)
        replacement = _make_scan(original)
        setattr(mod, arch.scan, replacement)
        _INSTALLED[key] = [original, replacement, 1]


def _uninstall(arch: Architecture) -> None:
    key = (arch.module, arch.scan)
    with _INSTALL_LOCK:
        entry = _INSTALLED.get(key)
        if entry is None:
            return
        entry[2] -= 1
        if entry[2] == 0:
            mod = importlib.import_module(arch.module)
            if getattr(mod, arch.scan) is entry[1]:
                setattr(mod, arch.scan, entry[0])
            del _INSTALLED[key]


class ModelPatch:
    """Context manager: while active, every forward of ``model`` runs its SSM layers as
    prefill (exact chunked scan of the first ``prefill`` tokens) + decode emulation of ``cfg``.

    Only whole-sequence forwards without a cache are emulated; a cached single-token decode
    call would silently bypass the emulation, so it raises instead.
    """

    def __init__(self, model: torch.nn.Module, cfg: PrecisionConfig | str, *, prefill: int,
                 seed: int = 0, decay: DecayRecorder | None = None) -> None:
        if prefill < 0:
            raise ValueError(f"prefill must be >= 0, got {prefill}")
        self.model = model
        self.cfg = parse_config(cfg)
        self.prefill = int(prefill)
        self.seed = int(seed)
        self.decay = decay
        self.arch = architecture(model)
        self.layers = ssm_layers(model)
        self._handles: list = []
        self._tokens: list[contextvars.Token] = []
        self._entered = False

    # -- context management
    def __enter__(self) -> ModelPatch:
        if self._entered:
            raise RuntimeError("ModelPatch is not re-entrant; create a new one")
        _install(self.arch)
        self._entered = True
        try:
            for layer in self.layers:
                self._handles.append(layer.module.register_forward_pre_hook(
                    self._make_pre_hook(layer), with_kwargs=True))
                self._handles.append(layer.module.register_forward_hook(
                    self._post_hook, always_call=True))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._tokens.clear()
        if self._entered:
            _uninstall(self.arch)
            self._entered = False

    def _make_pre_hook(self, layer: SSMLayer):
        def pre_hook(module, args, kwargs):
            cache = kwargs.get("cache_params")
            if cache is not None and cache.has_previous_state(layer.layer):
                raise RuntimeError(
                    "a patched model emulates whole teacher-forced sequences; call it without a "
                    "cache (use_cache=False)")
            self._tokens.append(_CURRENT.set(_Active(self, layer)))
            return None

        return pre_hook

    def _post_hook(self, module, args, output):
        if self._tokens:
            _CURRENT.reset(self._tokens.pop())
        return None

    # -- the patched scans
    def _scan(self, layer: SSMLayer, original, args: tuple, kwargs: dict):
        if layer.kind == "mamba2":
            return self._mamba2(layer, original, _mamba2_args(*args, **kwargs))
        return self._gdn(layer, original, _gdn_args(*args, **kwargs))

    def _mamba2(self, layer: SSMLayer, original, a: dict):
        from .. import kernels

        x, dt_raw, A = a["hidden_states"], a["dt"], a["A"]
        T = x.shape[1]
        P = min(self.prefill, T)
        dt = dt_raw.float()
        if a["dt_bias"] is not None:
            dt = dt + a["dt_bias"].detach().float()
        if a["dt_softplus"]:
            dt = F.softplus(dt)
        lo, hi = a["dt_limit"]
        dt = torch.clamp(dt, min=lo, max=hi)
        A32 = A.detach().float()
        if self.decay is not None:
            self.decay.add(layer.layer, "mamba2", torch.exp(dt * A32))
        call = {k: v for k, v in a.items() if k != "extra"} | a["extra"]
        if P >= T:
            return original(**call)
        if P > 0:
            pre = call | {"hidden_states": x[:, :P], "dt": dt_raw[:, :P], "B": a["B"][:, :P],
                          "C": a["C"][:, :P], "return_final_states": True}
            y_pre, S0 = original(**pre)
        else:
            y_pre, S0 = None, a["initial_states"]
        D = a["D"].detach().float() if a["D"] is not None else None
        y, S_final = kernels.emulate_mamba2(
            self.cfg, S0.float().contiguous() if S0 is not None else None,
            x[:, P:].contiguous(), dt[:, P:].contiguous(), A32, a["B"][:, P:].contiguous(),
            a["C"][:, P:].contiguous(), D, layer=layer.layer, seed=self.seed, act_dtype=x.dtype)
        out = y if y_pre is None else torch.cat([y_pre, y.to(y_pre.dtype)], dim=1)
        if a["return_final_states"]:
            return out, S_final
        return out

    def _gdn(self, layer: SSMLayer, original, a: dict):
        from .. import kernels

        q, k, v, g, beta = a["query"], a["key"], a["value"], a["g"], a["beta"]
        T = q.shape[1]
        P = min(self.prefill, T)
        if self.decay is not None:
            self.decay.add(layer.layer, "gdn", torch.exp(g.detach().float()))
        call = {kk: vv for kk, vv in a.items() if kk != "extra"} | a["extra"]
        if P >= T:
            return original(**call)
        if P > 0:
            pre = call | {"query": q[:, :P], "key": k[:, :P], "value": v[:, :P], "g": g[:, :P],
                          "beta": beta[:, :P], "output_final_state": True}
            o_pre, S0 = original(**pre)
        else:
            o_pre, S0 = None, a["initial_state"]
        qd, kd = q[:, P:].float(), k[:, P:].float()
        if a["use_qk_l2norm_in_kernel"]:
            qd, kd = _l2norm(qd), _l2norm(kd)
        qd = qd * qd.shape[-1] ** -0.5
        qd, kd = _dedupe_key_heads(qd, layer), _dedupe_key_heads(kd, layer)
        S0v = S0.float().transpose(-1, -2).contiguous() if S0 is not None else None
        o, S_final = kernels.emulate_gdn(
            self.cfg, S0v, qd.contiguous(), kd.contiguous(), v[:, P:].contiguous(),
            g[:, P:].float().contiguous(), beta[:, P:].float().contiguous(),
            layer=layer.layer, seed=self.seed, act_dtype=v.dtype)
        out_dtype = o_pre.dtype if o_pre is not None else q.dtype
        o = o.to(out_dtype)
        out = o if o_pre is None else torch.cat([o_pre, o], dim=1)
        final = S_final.transpose(-1, -2).contiguous() if a["output_final_state"] else None
        return out, final


def _dedupe_key_heads(t: torch.Tensor, layer: SSMLayer) -> torch.Tensor:
    """Undo the mixer's ``repeat_interleave`` of q/k over value heads (value head ``h`` reads key
    head ``h // ratio``), so the emulation sees the real key heads; kept as is if the heads
    were not repeated that way."""
    heads, groups = layer.heads, layer.groups
    if t.shape[2] != heads or heads == groups:
        return t
    ratio = heads // groups
    sub = t[:, :, ::ratio]
    if torch.equal(sub.repeat_interleave(ratio, dim=2), t):
        return sub
    return t


def patch_model(model: torch.nn.Module, cfg: PrecisionConfig | str, *, prefill: int,
                seed: int = 0, decay: DecayRecorder | None = None) -> ModelPatch:
    """Patch ``model``'s SSM mixers for teacher-forced emulation of ``cfg`` (a context manager
    that restores the model on exit).

    >>> with patch_model(model, "nvfp4-read/fp32", prefill=512, seed=0):
    ...     logits = model(input_ids, use_cache=False).logits
    """
    return ModelPatch(model, cfg, prefill=prefill, seed=seed, decay=decay)


def iter_ssm_modules(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """The SSM mixer modules of ``model``."""
    for layer in ssm_layers(model):
        yield layer.module
