"""lm-eval model backend ``replayssm``: a Hugging Face hybrid decoding under a precision config.

Generation is real ReplaySSM decode (:class:`~replayssm_quant.models.decode.ReplayDecoder`): the
prompt goes through the model's exact prefill, then every generated token is a decode step whose
SSM layers carry a replay state (flush schedule, read copy, SR stream) from step to step.
Log-likelihoods are teacher-forced through the same path (exact prefill of the context, one
decode step per continuation token), so scoring and generation see identical numerics.

``model_args`` (lm-eval's ``key=value,...`` string or a dict):
``pretrained`` (fixture name, hub id, local folder, ``random:<model_type>``, or a loaded model
together with ``tokenizer``), ``config`` (preset or config string; inside a ``model_args``
string separate its fields with ``;`` or ``|``, e.g. ``config=ckpt=fp32;read=nvfp4;L=16``),
``seed``, ``device``, ``dtype``, ``batch_size``, ``max_gen_toks``, ``max_length``, ``kernels``
(``auto``/``reference``/``triton``), ``clamp_dt`` (see :class:`ReplayDecoder`),
``add_bos_token``, ``device_map`` (``balanced`` or a JSON map: the layers spread over several
GPUs, each SSM layer's replay state and kernels on its own layer's GPU).

Every generation is logged (:attr:`ReplaySSMLM.generation_log`) with its finish reason, so
answers cut off by ``max_gen_toks`` are counted as such instead of scored as finished ones.
Each entry also keeps the text and a key over prompt and generation kwargs
(:func:`generation_key`), so a later run of the same (task, config) with more items can pass the
log back (``reuse=``) and generate only the requests it has not answered before.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import lm_eval.models  # noqa: F401  (registers lm-eval's own backends before ours)
import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs
from lm_eval.utils import get_rolling_token_windows, hash_string, make_disjoint_window

from ..models.decode import Generation, ReplayDecoder
from ..precision import PrecisionConfig, parse_config

__all__ = [
    "DEFAULT_MAX_GEN_TOKS",
    "ReplaySSMLM",
    "Responder",
    "generation_key",
    "VLLMUnavailable",
    "parse_config_arg",
    "vllm_available",
    "vllm_engine_args",
    "vllm_lm",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_GEN_TOKS = 32768
"""Used when a request carries no ``max_gen_toks`` (lm-eval's own default would be 256)."""

Responder = Callable[[str, dict], "str | None"]
"""``(context, gen_kwargs) -> forced text or None``: a continuation to teacher-force through the
decode path (tests plant known answers this way); ``None`` lets the model generate."""

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def generation_key(context: str, gen_kwargs: dict[str, Any]) -> str:
    """What makes two generation requests the same request: the prompt and its generation
    kwargs (key-sorted JSON), hashed."""
    text = json.dumps([context, gen_kwargs], sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def parse_config_arg(value: str | PrecisionConfig) -> PrecisionConfig:
    """A ``config`` model argument: a preset, a config string, or one whose fields are joined
    by ``;`` or ``|`` (lm-eval splits ``model_args`` strings on commas)."""
    if isinstance(value, PrecisionConfig):
        return value
    return parse_config(str(value).replace(";", ",").replace("|", ","))


@register_model("replayssm")
class ReplaySSMLM(TemplateLM):
    """lm-eval LM whose SSM layers decode under one :class:`PrecisionConfig`."""

    def __init__(
        self,
        pretrained: str | torch.nn.Module = "random:nemotron_h",
        config: str | PrecisionConfig = "fp32",
        seed: int = 0,
        device: str | None = None,
        dtype: str = "float32",
        batch_size: int | str | None = 8,
        max_gen_toks: int = DEFAULT_MAX_GEN_TOKS,
        max_length: int | None = None,
        kernels: str = "auto",
        clamp_dt: bool = False,
        device_map: str | dict | None = None,
        tokenizer: Any = None,
        add_bos_token: bool = False,
        responder: Responder | None = None,
        progress: Callable[[int, int], None] | None = None,
        reuse: Iterable[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        kwargs.pop("max_batch_size", None)
        if kwargs:
            log.warning("replayssm backend ignores model arguments %s", sorted(kwargs))
        self.cfg = parse_config_arg(config)
        self.seed = int(seed)
        if isinstance(pretrained, torch.nn.Module):
            if tokenizer is None:
                raise ValueError("a loaded model needs its tokenizer (tokenizer=...)")
            model = pretrained
            name = str(getattr(model.config, "name_or_path", "") or type(model).__name__)
        else:
            from ..models.loading import load_model

            if dtype not in _DTYPES:
                raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
            model, tok = load_model(str(pretrained), device=device or "cpu",
                                    dtype=_DTYPES[dtype], device_map=device_map)
            tokenizer = tokenizer or tok
            name = str(pretrained)
        if device is not None and device_map is None and \
                torch.device(device) != next(model.parameters()).device:
            model.to(device)
        self.model = model
        self.model_name = name
        self.tokenizer = tokenizer
        self.decoder = ReplayDecoder(model, self.cfg, seed=self.seed, backend=kernels,
                                     clamp_dt=bool(clamp_dt))
        self.batch_size = self._batch(batch_size)
        self.max_gen_toks = int(max_gen_toks)
        self._max_length = int(max_length) if max_length else None
        self.add_bos_token = bool(add_bos_token)
        self.responder = responder
        self.progress = progress
        self.generation_log: list[dict[str, Any]] = []
        self.reuse = {e["key"]: e for e in reuse or () if "key" in e and "text" in e}

    @staticmethod
    def _batch(batch_size: int | str | None) -> int:
        if batch_size is None or (isinstance(batch_size, str) and batch_size.startswith("auto")):
            return 8
        b = int(batch_size)
        if b < 1:
            raise ValueError(f"batch_size must be >= 1, got {b}")
        return b

    # ----------------------------------------------------------------------- tokens
    def _real_eos(self) -> int | None:
        eos = self.tokenizer.eos_token_id
        if eos is None:
            eos = getattr(self.model.config, "eos_token_id", None)
            if isinstance(eos, list):
                eos = eos[0] if eos else None
        return None if eos is None else int(eos)

    @property
    def eot_token_id(self) -> int:
        """EOS; a model without one (e.g. random test models) falls back to BOS/PAD/0, which
        then only serves as the empty-context prefix and never stops a generation."""
        eos = self._real_eos()
        if eos is not None:
            return eos
        for t in (self.tokenizer.bos_token_id, self.tokenizer.pad_token_id):
            if t is not None:
                return int(t)
        return 0

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return int(bos) if bos is not None else self.eot_token_id

    @property
    def max_length(self) -> int:
        if self._max_length:
            return self._max_length
        return int(getattr(self.model.config, "max_position_embeddings", 0) or 1 << 20)

    @property
    def device(self) -> torch.device:
        return self.decoder.device

    def tok_encode(self, string: str, add_special_tokens: bool | None = None,
                   **kwargs: Any) -> list[int]:
        ids = self.tokenizer.encode(string, add_special_tokens=False)
        bos = self.tokenizer.bos_token_id
        add = self.add_bos_token if add_special_tokens is None else add_special_tokens
        if add and bos is not None and (not ids or ids[0] != bos):
            ids = [int(bos)] + ids
        return ids

    def tok_decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=False)

    def _eos_ids(self) -> list[int]:
        eos = self._real_eos()
        ids = set() if eos is None else {eos}
        extra = getattr(self.model.config, "eos_token_id", None)
        if isinstance(extra, int):
            ids.add(extra)
        elif isinstance(extra, list):
            ids.update(int(e) for e in extra)
        return sorted(ids)

    def get_model_info(self) -> dict[str, Any]:
        return {"model": self.model_name, "replayssm_config": str(self.cfg),
                "replayssm_config_name": self.cfg.label, "replayssm_seed": self.seed,
                "replayssm_kernels": self.decoder.use_kernels}

    # ----------------------------------------------------------------------- generation
    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Greedy generation per request, batched among requests with identical
        ``gen_kwargs`` (longest prompts first, so a batch's padding stays small).

        A request whose key (:func:`generation_key`) is among the ``reuse`` entries is answered
        with the stored text and its log entry copied (``"reused": true``); only the rest are
        generated. Greedy decoding makes this exact up to batch composition: a prompt decoded
        in another batch sees other padding, which can move float results by rounding.
        """
        out: list[str | None] = [None] * len(requests)
        groups: dict[str, list[int]] = defaultdict(list)
        args = [req.args for req in requests]
        keys = [generation_key(ctx, gk) for ctx, gk in args]
        done = 0
        total = len(requests)
        for i, (_, gk) in enumerate(args):
            old = self.reuse.get(keys[i])
            if old is not None:
                out[i] = old["text"]
                self.generation_log.append(old | {"reused": True})
                self.cache_hook.add_partial("generate_until", args[i], old["text"])
                done += 1
            else:
                groups[json.dumps(gk, sort_keys=True, default=str)].append(i)
        if done and self.progress is not None:
            self.progress(done, total)
        encoded = {i: self.tok_encode(args[i][0]) for idx in groups.values() for i in idx}
        eos = self._real_eos()
        eos_text = None if eos is None else self.tok_decode([eos])
        for idx in groups.values():
            gen_kwargs = copy.deepcopy(args[idx[0]][1])
            kw = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
            until = handle_stop_sequences(kw.pop("until", None), eos=eos_text)
            max_gen = int(kw.pop("max_gen_toks"))
            do_sample = bool(kw.pop("do_sample", False))
            temperature = float(kw.pop("temperature", 0.0) or 0.0)
            order = sorted(idx, key=lambda i: (-len(encoded[i]), args[i][0]))
            for start in range(0, len(order), self.batch_size):
                batch = order[start:start + self.batch_size]
                forced = self._forced(batch, args)
                gens = self._generate_batch(batch, encoded, until, max_gen, do_sample,
                                            temperature, forced)
                for j, (i, g) in enumerate(zip(batch, gens, strict=True)):
                    out[i] = g.text
                    self.generation_log.append({
                        "key": keys[i], "prompt_hash": hash_string(args[i][0]),
                        "prompt_tokens": g.prompt_tokens, "gen_tokens": len(g.tokens),
                        "finish": g.finish, "truncated": g.truncated, "stop": g.stop,
                        "max_gen_toks": max_gen, "until": until,
                        "config": str(self.cfg),
                        "forced": forced is not None and forced[j] is not None,
                        "reused": False, "text": g.text,
                    })
                    self.cache_hook.add_partial("generate_until", args[i], g.text)
                done += len(batch)
                if self.progress is not None:
                    self.progress(done, total)
        return [o if o is not None else "" for o in out]

    def _forced(self, batch: list[int], args: list) -> list[list[int] | None] | None:
        if self.responder is None:
            return None
        out: list[list[int] | None] = []
        for i in batch:
            text = self.responder(args[i][0], args[i][1])
            out.append(None if text is None else self.tok_encode(text, False))
        return out

    def _generate_batch(self, batch: list[int], encoded: dict[int, list[int]], until: list[str],
                        max_gen: int, do_sample: bool, temperature: float,
                        forced: list[list[int] | None] | None) -> list[Generation]:
        prompts = []
        for i in batch:
            ids = encoded[i]
            if self._max_length and len(ids) >= self._max_length:
                ids = ids[-(self._max_length - 1):]
            prompts.append(ids)
        return self.decoder.generate(
            prompts, max_new_tokens=max_gen, tokenizer=self.tokenizer, stop=until,
            eos_token_ids=self._eos_ids(), pad_token_id=self.tokenizer.pad_token_id,
            max_length=self._max_length, do_sample=do_sample and temperature > 0,
            temperature=temperature or 1.0, forced=forced)

    # ----------------------------------------------------------------------- likelihoods
    def _loglikelihood_tokens(self, requests: list[tuple[tuple[str, str], list[int], list[int]]],
                              disable_tqdm: bool = False, **kwargs: Any
                              ) -> list[tuple[float, bool]]:
        """Teacher-forced scores through the decode path, batched longest first."""
        res: list[tuple[float, bool] | None] = [None] * len(requests)
        limit = self.max_length
        pairs = []
        for _, ctx, cont in requests:
            cont = cont[-limit:]
            ctx = ctx[-max(1, limit - len(cont)):] if ctx else [self.prefix_token_id]
            pairs.append((ctx, cont))
        order = sorted(range(len(pairs)), key=lambda i: -(len(pairs[i][0]) + len(pairs[i][1])))
        for start in range(0, len(order), self.batch_size):
            batch = order[start:start + self.batch_size]
            scores = self.decoder.score([pairs[i][0] for i in batch], [pairs[i][1] for i in batch],
                                        pad_token_id=self._pad_id())
            for i, s in zip(batch, scores, strict=True):
                res[i] = s
                self.cache_hook.add_partial("loglikelihood", requests[i][0], s)
        return [r for r in res if r is not None]

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False
                              ) -> list[float]:
        """Rolling windows of ``max_length`` tokens as in lm-eval's HF backend."""
        out = []
        for req in requests:
            (string,) = req.args
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1)]
            total = 0.0
            for start in range(0, len(windows), self.batch_size):
                chunk = windows[start:start + self.batch_size]
                scores = self.decoder.score([c for c, _ in chunk], [p for _, p in chunk],
                                            pad_token_id=self._pad_id())
                total += sum(s for s, _ in scores)
            out.append(total)
            self.cache_hook.add_partial("loglikelihood_rolling", (string,), total)
        return out

    def _pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad) if pad is not None else self.eot_token_id


# ----------------------------------------------------------------------------- vLLM
class VLLMUnavailable(RuntimeError):
    """``--backend vllm`` without vLLM installed."""


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def _match_outputs(contexts: list[str], encoded: list[list[int]],
                   outputs: list[tuple[tuple[int, ...], str | None, int]],
                   max_gen_toks: list[int]) -> list[dict[str, Any]]:
    """Generation-log entries for ``contexts`` from vLLM outputs ``(prompt ids, finish_reason,
    generated tokens)``; a prompt vLLM received left-truncated is matched by its tail."""
    by_ids: dict[tuple[int, ...], list[tuple[str | None, int]]] = defaultdict(list)
    for ids, reason, n in outputs:
        by_ids[ids].append((reason, n))
    entries = []
    for ctx, ids, mg in zip(contexts, encoded, max_gen_toks, strict=True):
        hit = by_ids.get(tuple(ids))
        if not hit:
            hit = next((v for k, v in by_ids.items() if k and tuple(ids[-len(k):]) == k), None)
        reason, n = hit[0] if hit else (None, None)
        entries.append({
            "prompt_hash": hash_string(ctx), "prompt_tokens": len(ids), "gen_tokens": n,
            "finish": None if reason is None else ("length" if reason == "length" else "stop"),
            "truncated": None if reason is None else reason == "length",
            "stop": None, "max_gen_toks": mg,
        })
    return entries


def vllm_engine_args(config: str | PrecisionConfig, seed: int = 0) -> dict[str, Any]:
    """vLLM engine arguments that serve ``config`` through the ReplaySSM plugin: the config in
    ``additional_config["replayssm_quant"]`` (a mapping with the SR seed when it is not 0),
    ``use_replayssm`` / ``replayssm_buffer_len`` for configs that replay (the plugin takes L
    from the buffer length), and no prefix caching (it would copy only part of the state)."""
    cfg = parse_config_arg(config)
    entry: Any = str(cfg) if int(seed) == 0 else {"config": str(cfg), "seed": int(seed)}
    args: dict[str, Any] = {"additional_config": {"replayssm_quant": entry},
                            "enable_prefix_caching": False}
    if cfg.L > 1:
        args |= {"use_replayssm": True, "replayssm_buffer_len": cfg.L}
    return args


def vllm_lm(pretrained: str, config: str | PrecisionConfig, *, seed: int = 0,
            max_gen_toks: int = DEFAULT_MAX_GEN_TOKS, batch_size: int | str = "auto",
            dtype: str = "auto", **kwargs: Any) -> Any:
    """lm-eval's ``vllm`` backend serving ``pretrained`` with the ReplaySSM plugin configured by
    ``additional_config={"replayssm_quant": <config string>}`` (:func:`vllm_engine_args`); it
    also logs every generation's finish reason so truncated answers are counted as with the
    ``replayssm`` backend."""
    if not vllm_available():
        raise VLLMUnavailable("--backend vllm needs vLLM, which is not installed "
                              "(pip install 'replayssm-quant[vllm]')")
    from lm_eval.models.vllm_causallms import VLLM

    cfg = parse_config_arg(config)

    class ReplaySSMVLLM(VLLM):
        """lm-eval's vLLM backend plus a generation log (finish reasons)."""

        def _model_generate(self, requests, generate=False, sampling_params=None):
            out = super()._model_generate(requests=requests, generate=generate,
                                          sampling_params=sampling_params)
            if generate:
                for o in out:
                    c = o.outputs[0]
                    self._captured.append((tuple(o.prompt_token_ids or ()), c.finish_reason,
                                           len(c.token_ids)))
            return out

        def generate_until(self, requests, disable_tqdm: bool = False):
            self._captured = []
            res = super().generate_until(requests, disable_tqdm=disable_tqdm)
            contexts = [r.args[0] for r in requests]
            mgs = [int(normalize_gen_kwargs(r.args[1], self.max_gen_toks)["max_gen_toks"])
                   for r in requests]
            encoded = [self.tok_encode(c) for c in contexts]
            self.generation_log.extend(_match_outputs(contexts, encoded, self._captured, mgs))
            return res

    lm = ReplaySSMVLLM(pretrained=pretrained, dtype=dtype, seed=int(seed),
                       max_gen_toks=int(max_gen_toks), batch_size=batch_size,
                       **(vllm_engine_args(cfg, seed) | kwargs))
    lm.generation_log = []
    lm.cfg = cfg
    return lm
