"""Token-by-token ReplaySSM decoding of a Hugging Face hybrid model.

Task accuracy under a precision config has to be measured on what a serving engine would emit:
the prompt goes through the model's own exact prefill, and every generated token is a decode step
whose SSM layers read and write a :class:`~replayssm_quant.ssm.replay.ReplayState` (checkpoint,
read copy, ring, flush schedule, SR stream) carried across steps. Everything else stays the
model's own code: :class:`ReplayDecoder` drives the HF model with its own cache object for the
attention layers (and the convolution states), and only the mixers' single-token state update
(``mamba2_selective_state_update`` in NemotronH / Mamba-2, ``torch_recurrent_gated_delta_rule``
in Qwen3.5 / Qwen3-Next) is routed to the replay state. With the ``fp32`` preset the result is
the unpatched model's greedy ``generate()``.

On CUDA the steps run the Triton decode kernels on the same state tensors; elsewhere the pure
torch reference.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from .. import interception
from ..precision import PrecisionConfig, parse_config
from ..ssm import gdn as ref_gdn
from ..ssm import mamba2 as ref_mamba2
from ..ssm.replay import ACT_DTYPES, ReplayState, enable_read_cache, load_state
from .loading import module_device
from .patch import gdn_l2norm
from .registry import SSMLayer, architecture, ssm_layers

__all__ = [
    "DecodeHookError",
    "Generation",
    "ReplayDecoder",
    "STEP_FUNCTIONS",
]

STEP_FUNCTIONS: dict[str, str] = {
    "mamba2": "mamba2_selective_state_update",
    "gdn": "torch_recurrent_gated_delta_rule",
}
"""Module-level single-token state update each SSM kind's mixer calls during cached decode."""


class DecodeHookError(RuntimeError):
    """A decode step ran an SSM layer without going through the replay state."""


@dataclass
class Generation:
    """One generated continuation.

    ``finish`` is ``eos`` (an end-of-sequence token), ``stop`` (a stop string; ``stop`` names
    it) or ``length`` (``max_new_tokens`` or the model's length limit ran out first, so the
    text is an unfinished answer). ``tokens`` are all generated token ids, stop string and EOS
    included; ``text`` is the continuation cut before the first stop string / EOS.
    """

    tokens: list[int]
    text: str
    finish: str
    prompt_tokens: int
    stop: str | None = None

    @property
    def truncated(self) -> bool:
        return self.finish == "length"


# ----------------------------------------------------------------------------------- hooks
@dataclass
class _Active:
    session: _Session
    layer: SSMLayer


_ACTIVE: interception.ContextSlot[_Active] = interception.ContextSlot("replayssm_decode_layer")
"""The session and layer whose mixer forward is running in this thread / task."""


def _make_step(original: Callable, kind: str) -> Callable:
    def step(*args, **kwargs):
        active = _ACTIVE.get()
        if active is None or not active.session.decoding:
            return original(*args, **kwargs)
        if kind == "mamba2":
            return active.session.mamba2_step(active.layer, *args, **kwargs)
        return active.session.gdn_step(active.layer, *args, **kwargs)

    return step


_MAKE_STEP: dict[str, interception.MakeWrapper] = {
    kind: functools.partial(_make_step, kind=kind) for kind in STEP_FUNCTIONS}
"""One wrapper maker per SSM kind (the same object every time, as the refcount requires)."""


def _acquire_step(module_name: str, kind: str) -> tuple[str, str]:
    """Route ``kind``'s single-token state update in ``module_name`` through the sessions."""
    key = (module_name, STEP_FUNCTIONS[kind])
    try:
        interception.acquire(*key, _MAKE_STEP[kind])
    except interception.MissingTarget:
        raise DecodeHookError(f"{module_name} has no {key[1]}; this transformers version "
                              "is not supported by the ReplaySSM decoder") from None
    return key


# ----------------------------------------------------------------------------------- session
@dataclass
class _Session:
    """Replay states of one batch of sequences, plus the bookkeeping of one forward."""

    decoder: ReplayDecoder
    states: dict[int, ReplayState]
    slots: torch.Tensor  # cache slot of each current batch row
    decoding: bool = False
    calls: int = 0
    kernels: dict[int, Any] = field(default_factory=dict)

    def _slots_for(self, layer: SSMLayer) -> torch.Tensor:
        return self.slots.to(self.states[layer.layer].device)

    def mamba2_step(self, layer: SSMLayer, state: torch.Tensor, hidden_states: torch.Tensor,
                    dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                    D: torch.Tensor | None = None, dt_bias: torch.Tensor | None = None,
                    dt_softplus: bool = False, z: torch.Tensor | None = None,
                    **kwargs: Any) -> torch.Tensor:
        """``mamba2_selective_state_update`` with the state read and written through the replay
        state; ``dt`` follows the upstream decode path (bias and softplus in the input dtype)."""
        self.calls += 1
        rs = self.states[layer.layer]
        dt = dt[..., 0] if dt.dim() == 3 else dt
        if dt_bias is not None:
            dt = dt + (dt_bias[..., 0] if dt_bias.dim() == 2 else dt_bias).to(dt.dtype)
        if dt_softplus:
            dt = F.softplus(dt)
        if self.decoder.clamp_dt:
            lo, hi = getattr(layer.module, "time_step_limit", (0.0, float("inf")))
            dt = torch.clamp(dt, min=lo, max=hi)
        dt32 = dt.float().contiguous()
        A32 = (A[:, 0, 0] if A.dim() == 3 else A).float().contiguous()
        D32 = None if D is None else (D[:, 0] if D.dim() == 2 else D).float().contiguous()
        slots = self._slots_for(layer)
        if self.decoder.use_kernels:
            from ..kernels.mamba2 import mamba2_decode_step

            act = rs.act_dtype
            y = mamba2_decode_step(self._kernel_cache(layer), hidden_states.to(act).contiguous(),
                                   dt32, A32, B.to(act).contiguous(), C.contiguous(), D32,
                                   slots.to(torch.int32))
        else:
            y = ref_mamba2.decode_step(rs, hidden_states, dt32, A32, B, C, D32, slots)
        if z is not None:
            y = y * F.silu(z.float())
        return y.to(hidden_states.dtype)

    def gdn_step(self, layer: SSMLayer, query: torch.Tensor, key: torch.Tensor,
                 value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                 initial_state: torch.Tensor | None = None, output_final_state: bool = False,
                 use_qk_l2norm_in_kernel: bool = False, **kwargs: Any):
        """``torch_recurrent_gated_delta_rule`` for one token with the state in the replay
        state. Returns the HF cache tensor unchanged as the "final state": the replay state,
        not the HF cache, carries the recurrence."""
        self.calls += 1
        if query.shape[1] != 1:
            raise DecodeHookError("the ReplaySSM decoder steps one token at a time")
        rs = self.states[layer.layer]
        q, k = query[:, 0].float(), key[:, 0].float()
        if use_qk_l2norm_in_kernel:
            q, k = gdn_l2norm(q), gdn_l2norm(k)
        q = q / (q.shape[-1] ** 0.5)
        hk = layer.groups
        if q.shape[1] != hk:  # the mixer repeated key heads over value heads
            ratio = q.shape[1] // hk
            q, k = q[:, ::ratio].contiguous(), k[:, ::ratio].contiguous()
        v = value[:, 0]
        g32 = g[:, 0].float().contiguous()
        b32 = beta[:, 0].float().contiguous()
        slots = self._slots_for(layer)
        if self.decoder.use_kernels:
            from ..kernels.gdn import gdn_decode_step

            act = rs.act_dtype
            o = gdn_decode_step(self._kernel_cache(layer), q.contiguous(),
                                k.to(act).contiguous(), v.to(act).contiguous(), g32, b32,
                                slots.to(torch.int32))
        else:
            o = ref_gdn.decode_step(rs, q, k, v, g32, b32, slots)
        return o[:, None].to(query.dtype), initial_state

    def _kernel_cache(self, layer: SSMLayer):
        if layer.layer not in self.kernels:
            from ..kernels.core.cache import cache_from_reference

            self.kernels[layer.layer] = cache_from_reference(self.states[layer.layer])
        return self.kernels[layer.layer]


# ----------------------------------------------------------------------------------- decoder
class ReplayDecoder:
    """Greedy (or seeded sampling) generation and teacher-forced scoring of a HF hybrid model
    with every SSM layer decoding under ``cfg``.

    ``seed`` keys the stochastic rounding stream (with the layer index, the cache slot, i.e. the
    row of a batch, and the flush index), so a run is reproducible. ``backend``: ``auto``
    (Triton kernels on CUDA, the reference elsewhere), ``reference`` or ``triton``.

    ``clamp_dt``: Mamba-2 mixers in transformers clamp ``dt`` to ``time_step_limit`` in their
    chunked scan (prefill, training, teacher-forced forwards) but not in their single-token
    update, so the model's own ``generate()`` and its full forward disagree wherever ``dt``
    falls below the limit. The default follows ``generate()`` (and mamba_ssm's decode);
    ``True`` follows the forward, as the teacher-forced drift emulation does.
    """

    def __init__(self, model: torch.nn.Module, cfg: PrecisionConfig | str = "fp32", *,
                 seed: int = 0, backend: str = "auto", clamp_dt: bool = False) -> None:
        self.model = model
        self.clamp_dt = bool(clamp_dt)
        self.cfg = parse_config(cfg)
        self.seed = int(seed)
        self.arch = architecture(model)
        self.layers = ssm_layers(model)
        if backend not in ("auto", "reference", "triton"):
            raise ValueError(f"backend must be auto, reference or triton, got {backend!r}")
        self.device = next(model.parameters()).device
        # each layer's replay state lives where its mixer runs (several GPUs under a device
        # map); the logits come out wherever the LM head is
        self.layer_devices = {s.layer: module_device(s.module) for s in self.layers}
        self.head_device = module_device(model.get_output_embeddings())
        self.use_kernels = backend == "triton" or (backend == "auto" and self.device.type == "cuda")
        self._accepts = set(inspect.signature(model.forward).parameters)
        # Mamba2ForCausalLM names its cache ``cache_params``; the hybrids ``past_key_values``
        self._cache_arg = "past_key_values" if "past_key_values" in self._accepts else \
            "cache_params"
        dtype = next(model.parameters()).dtype
        self.model_dtype = dtype if dtype in ACT_DTYPES else torch.float32

    # -- state
    def _new_session(self, batch: int) -> _Session:
        cfg = self.cfg
        # The ring stores activations in the model's dtype (what vLLM keeps); with L = 1 there
        # is no ring, so nothing is rounded on the way in.
        act = self.model_dtype if cfg.L > 1 else torch.float32
        states: dict[int, ReplayState] = {}
        for s in self.layers:
            if s.kind == "mamba2":
                states[s.layer] = ref_mamba2.init_mamba2_state(
                    cfg, batch, s.heads, s.head_dim, s.d_state, s.groups, layer=s.layer,
                    seed=self.seed, act_dtype=act, device=self.layer_devices[s.layer])
            else:
                states[s.layer] = ref_gdn.init_gdn_state(
                    cfg, batch, s.heads, s.head_dim, s.d_state, s.groups, layer=s.layer,
                    seed=self.seed, act_dtype=act, device=self.layer_devices[s.layer])
            if not self.use_kernels:  # the kernels write these tensors behind the cache's back
                enable_read_cache(states[s.layer])
        return _Session(self, states, torch.arange(batch, device=self.device))

    def _load_prefill(self, session: _Session, cache: Any) -> None:
        """Start every replay state from the exact prefill state the model left in its cache."""
        for s in self.layers:
            S = _recurrent_state(cache, s.layer)
            if s.kind == "gdn":  # HF keeps (B, Hv, K, V); the replay state rows are (V, K)
                S = S.transpose(-1, -2)
            rs = session.states[s.layer]
            slots = torch.arange(rs.num_slots, device=rs.device)
            load_state(rs, slots, S.float().to(rs.device).contiguous())

    # -- forward
    def _forward(self, session: _Session, input_ids: torch.Tensor,
                 attention_mask: torch.Tensor | None, position_ids: torch.Tensor,
                 cache: Any, decoding: bool) -> tuple[torch.Tensor, Any]:
        kwargs: dict[str, Any] = {"input_ids": input_ids, "use_cache": True,
                                  self._cache_arg: cache}
        if "position_ids" in self._accepts:
            kwargs["position_ids"] = position_ids
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask
        if "logits_to_keep" in self._accepts:
            kwargs["logits_to_keep"] = 1
        session.decoding = decoding
        session.calls = 0
        try:
            out = self.model(**kwargs)
        finally:
            session.decoding = False
        if decoding and session.calls != len(self.layers):
            raise DecodeHookError(
                f"{session.calls} of {len(self.layers)} SSM layers went through the replay state "
                "in a decode step; the mixers call a state update this decoder does not hook "
                "(e.g. a hub kernel); refusing to report numbers for the wrong numerics")
        cache = getattr(out, "past_key_values", None)
        if cache is None:
            cache = getattr(out, "cache_params", None)
        return out.logits[:, -1].float(), cache

    def _run(self, prompts: Sequence[Sequence[int]], pad_id: int,
             feed: Callable[[torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]],
             max_steps: int) -> None:
        """Prefill ``prompts`` then decode: ``feed(logits, rows, step)`` gets the next-token
        logits of the still active ``rows`` (indices into ``prompts``) and returns
        ``(next token per row, keep mask)``; rows it drops leave the batch."""
        n = len(prompts)
        if n == 0:
            return
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        T = max(len(p) for p in prompts)
        ids = torch.full((n, T), pad_id, dtype=torch.long)
        mask = torch.zeros((n, T), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, T - len(p):] = torch.as_tensor(list(p), dtype=torch.long)
            mask[i, T - len(p):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
        padded = not bool((mask == 1).all())
        session = self._new_session(n)
        hooks = self._enter(session)
        try:
            with torch.inference_mode():
                logits, cache = self._forward(session, ids, mask if padded else None, pos,
                                              None, decoding=False)
                self._load_prefill(session, cache)
                rows = torch.arange(n, device=self.device)
                last = pos[:, -1:]
                step = 0
                while True:
                    tok, keep = feed(logits, rows, step)
                    tok, keep = tok.to(self.device), keep.to(self.device)
                    if step + 1 >= max_steps or not bool(keep.any()):
                        break
                    if not bool(keep.all()):
                        idx = torch.nonzero(keep).flatten()
                        cache.reorder_cache(idx)
                        rows, tok, last = rows[idx], tok[idx], last[idx]
                        mask = mask[idx] if padded else mask
                        session.slots = session.slots[idx]
                    last = last + 1
                    if padded:
                        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                    logits, cache = self._forward(session, tok[:, None], mask if padded else None,
                                                  last, cache, decoding=True)
                    step += 1
        finally:
            self._exit(hooks)

    def _enter(self, session: _Session) -> list:
        key = _acquire_step(self.arch.module, self.arch.kind)
        try:
            handles = interception.hold_during_forward(
                _ACTIVE, ((s.module, _Active(session, s)) for s in self.layers))
        except BaseException:
            interception.release(*key)
            raise
        return [key, handles]

    @staticmethod
    def _exit(hooks: list) -> None:
        key, handles = hooks
        for h in handles:
            h.remove()
        interception.release(*key)

    # -- public API
    def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                 tokenizer: Any = None, stop: Sequence[str] = (),
                 eos_token_ids: Sequence[int] = (), pad_token_id: int | None = None,
                 max_length: int | None = None, do_sample: bool = False,
                 temperature: float = 1.0, sample_seed: int | None = None,
                 forced: Sequence[Sequence[int] | None] | None = None) -> list[Generation]:
        """Generate a continuation of every prompt (token ids) in one batch.

        Stops a row at an EOS token, at a stop string (needs ``tokenizer``) or after
        ``max_new_tokens`` tokens (``finish == "length"``: an unfinished answer). With
        ``max_length`` a row also stops when prompt + generation reach it. ``forced`` gives
        rows a token prefix to emit instead of the model's choice (teacher-forced through the
        same decode steps, stop rules applied); generation goes on freely after it.
        """
        if forced is not None and len(forced) != len(prompts):
            raise ValueError("forced needs one entry (or None) per prompt")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        stop = [s for s in stop if s]
        if stop and tokenizer is None:
            raise ValueError("stop strings need a tokenizer")
        eos = set(int(t) for t in eos_token_ids)
        n = len(prompts)
        out_tokens: list[list[int]] = [[] for _ in range(n)]
        finish: list[str | None] = [None] * n
        hit: list[str | None] = [None] * n
        limits = [max_new_tokens if max_length is None else
                  max(0, min(max_new_tokens, max_length - len(p))) for p in prompts]
        if any(lim == 0 for lim in limits):
            raise ValueError("a prompt leaves no room to generate within max_length")
        tail = max((len(s) for s in stop), default=0) + 4
        gen = None
        if do_sample:
            gen = torch.Generator(device=self.head_device)
            gen.manual_seed(self.seed if sample_seed is None else int(sample_seed))

        def feed(logits: torch.Tensor, rows: torch.Tensor, step: int):
            if do_sample and temperature > 0:
                probs = torch.softmax(logits / temperature, dim=-1)
                tok = torch.multinomial(probs, 1, generator=gen).flatten()
            else:
                tok = logits.argmax(-1)
            if forced is not None:
                for j, r in enumerate(rows.tolist()):
                    f = forced[r]
                    if f is not None and step < len(f):
                        tok[j] = int(f[step])
            keep = torch.ones_like(tok, dtype=torch.bool)
            for j, (r, t) in enumerate(zip(rows.tolist(), tok.tolist(), strict=True)):
                toks = out_tokens[r]
                toks.append(int(t))
                if t in eos:
                    finish[r] = "eos"
                elif stop:
                    window = tokenizer.decode(toks[-tail:], skip_special_tokens=False)
                    found = [s for s in stop if s in window]
                    if found:
                        finish[r], hit[r] = "stop", found[0]
                if finish[r] is None and len(toks) >= limits[r]:
                    finish[r] = "length"
                keep[j] = finish[r] is None
            return tok, keep

        pad = pad_token_id if pad_token_id is not None else next(iter(eos), 0)
        self._run(prompts, pad, feed, max(limits))
        results = []
        for i in range(n):
            toks = out_tokens[i]
            fin = finish[i] or "length"
            body = toks[:-1] if fin == "eos" else toks
            text = "" if tokenizer is None else tokenizer.decode(body, skip_special_tokens=False)
            if stop:
                cut = [(text.find(s), s) for s in stop if s in text]
                if cut:
                    at, s = min(cut)
                    text = text[:at]
                    if fin == "length":  # the stop string completed on the last token
                        fin, hit[i] = "stop", s
            results.append(Generation(toks, text, fin, len(prompts[i]), hit[i]))
        return results

    def score(self, contexts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]],
              *, pad_token_id: int = 0) -> list[tuple[float, bool]]:
        """Teacher-forced log-likelihood of each continuation after its context: exact prefill of
        the context, then every continuation token is a decode step. Returns ``(sum of log
        probabilities, whether every token was the greedy choice)`` per pair."""
        if len(contexts) != len(continuations):
            raise ValueError("contexts and continuations differ in length")
        if any(len(c) == 0 for c in continuations):
            raise ValueError("every continuation needs at least one token")
        n = len(contexts)
        logp = [0.0] * n
        greedy = [True] * n

        def feed(logits: torch.Tensor, rows: torch.Tensor, step: int):
            lp = torch.log_softmax(logits, dim=-1)
            best = lp.argmax(-1)
            tok = torch.empty_like(best)
            keep = torch.ones_like(best, dtype=torch.bool)
            for j, r in enumerate(rows.tolist()):
                t = int(continuations[r][step])
                logp[r] += float(lp[j, t])
                greedy[r] = greedy[r] and int(best[j]) == t
                tok[j] = t
                keep[j] = step + 1 < len(continuations[r])
            return tok, keep

        self._run(contexts, pad_token_id, feed, max(len(c) for c in continuations))
        return list(zip(logp, greedy, strict=True))


def _recurrent_state(cache: Any, layer: int) -> torch.Tensor:
    """The SSM state the prefill left in the HF cache for ``layer``."""
    try:
        entry = cache.layers[layer]
        S = entry.recurrent_states[0]
    except (AttributeError, IndexError, KeyError, TypeError):
        S = None
    if S is None:
        raise DecodeHookError(f"the model's cache holds no recurrent state for layer {layer} "
                              "after prefill; this cache layout is not supported")
    return S
