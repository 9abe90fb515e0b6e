#!/usr/bin/env python3
"""Continue training the fixture models on the plays mixed with probe-task examples.

The plays-only fixtures write play-like text whatever they are asked, so every probe task scores 0
on them. This script continues their training (same weights, same tokenizer) on a mix of the
Gutenberg plays and examples of the probe tasks in their exact evaluation prompts, so that the
fixtures retrieve a RULER ``niah_single_1`` needle at 2,048 and 4,096 tokens and walk a
``carry_chain`` table for 1,500 generated tokens, while their held-out bits per byte on the plays
stay close to before. Two steps:

``prepare`` (CPU, needs lm-eval's RULER generator, nltk and wonderwords) writes ``--out``
(default ``.probe-data/``, not versioned): ``probes.npz`` (token ids of the RULER training items,
seed 1, and of the held-out check items, seed 0 = ``eval``'s default seed), ``meta.json`` and
the Gutenberg archive, so that ``train`` needs only torch, transformers, tokenizers and numpy::

    python tools/train_probes.py prepare --out .probe-data

``train`` (GPU) starts from ``--init-from`` (default: the shipped fixture) and trains for
``--minutes`` on batches of play windows and packed probe sequences (``--probe-mix`` of each
batch), in ``--stages`` (``curriculum``: short needles first, then 2,048 tokens, then 4,096;
``carry``: mostly carry chains, for a continuation). Every ``--val-seconds`` it measures the
plays validation loss and, within ``--val-tolerance`` of the start, fp32 greedy accuracy on
RULER training items held out of training and carry-chain problems of seed 202; the best
checkpoint (worst task's accuracy / target) is written to ``<out>/<model>/`` at once, so a run
cut short still leaves it. At the end it measures held-out bits per byte, the decay spectrum and
accuracy on 100 held-out check items per task (seed 0, ``eval``'s items) and writes
``model.safetensors``, ``card.json`` and ``card.md``. The shipped fixtures were trained on one
H100 with ``.probe-data`` carried to the machine, attention limited to 16 tokens, on shift
chains (each card lists its runs). qwen3.5-tiny, with fla-core 0.6.0 on the path
(``--fla-gdn``: ``gdn_training.py``)::

    python3 tools/train_probes.py train --models qwen3.5-tiny --data .probe-data \
      --device cuda --fla-gdn --attention-window 16 --carry-rule shift --probe-mix 0.75 \
      --val-seconds 50 --select-n 24 --check-n 100 --minutes 6.5 --out $OUT

CPU smoke run::

    python tools/train_probes.py train --models nemotron-h-tiny --device cpu --steps 4 \
      --check-n 1 --select-n 1 --carry-pool 8 --val-seconds 1000 --val-windows 1 \
      --out /tmp/probe-smoke

Loss: play windows are distilled from the plays-only model (KL per token, ``--plays-loss kl``;
the plays-only fixture sits at its best validation step, and cross-entropy on its small corpus
overfits within minutes); probe sequences train on their completions only (the answer
a model generates), and each sequence's loss is its mean over the tokens it trains, averaged over
the batch. A RULER prompt is ~2,000 tokens of repeated filler around ~10 answer tokens: summed
over tokens, the filler would swamp the answer and teach the plays' model to predict filler;
per-sequence means give the ``--probe-mix`` share of the gradient to the probes' answers.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import os
import platform
import random
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import gdn_training as gdn  # noqa: E402
import train_fixtures as tf  # noqa: E402

DEFAULT_DATA = ROOT / ".probe-data"
RULER_TASK = "niah_single_1"
LENGTHS = (2048, 4096)
TRAIN_SEED = 1  # RULER training items; eval's default seed is 0
CARRY_TRAIN_SEED = 101  # carry-chain training problems; checks use seed 0 (eval's items)
CHECK_SEED = 0
SELECT_CARRY_SEED = 202  # carry-chain problems the checkpoint is chosen on
PAD = 0


def _module(name: str, rel: str):
    """A module of the package loaded from its file (the package's imports need more than torch)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / rel)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def carry_chain_module():
    return _module("replayssm_carry_chain", "replayssm_quant/evals/carry_chain.py")


def apply_attention_window(model):
    """The package's windowed attention (``models/window.py``), applied when the config sets one."""
    window = sys.modules.get("replayssm_window") or _module("replayssm_window",
                                                            "replayssm_quant/models/window.py")
    return window.apply_attention_window(model)


def carry_prompt(doc: dict) -> str:
    """MATH's ``doc_to_text`` (what lm-eval shows the model; ``prepare`` checks the equality)."""
    return "Problem:" + "\n" + doc["problem"] + "\n\n" + "Solution:"


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


# ----------------------------------------------------------------------------- prepare


def _flat(seqs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.cumsum([0] + [len(s) for s in seqs]).astype(np.int64)
    return np.concatenate([np.asarray(s, dtype=np.uint16) for s in seqs]), offsets


def prepare(args) -> int:
    """RULER items (train and check) as token ids, the Gutenberg archive, ``meta.json``."""
    from transformers import AutoTokenizer

    from replayssm_quant.evals import gutenberg, probe_data
    from replayssm_quant.evals.carry_chain import make_docs
    from replayssm_quant.evals.ruler import ruler_docs

    tok_dir = tf.DEFAULT_OUT / tf.MODELS[0]
    digests = {_md5(tf.DEFAULT_OUT / m / "tokenizer.json") for m in tf.MODELS}
    if len(digests) != 1:
        raise SystemExit("the fixtures' tokenizers differ; prepare one data folder per model")
    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {}
    answers: dict[str, list[list[str]]] = {}
    for length in LENGTHS:
        key = f"{RULER_TASK}@{length}"
        t0 = time.perf_counter()
        train = probe_data.ruler_examples(RULER_TASK, str(tok_dir), length, args.n, TRAIN_SEED)
        ids, masks = zip(*(probe_data.encode_example(e, tokenizer) for e in train), strict=True)
        arrays[f"train/{key}/ids"], arrays[f"train/{key}/offsets"] = _flat(list(ids))
        arrays[f"train/{key}/prompt_len"] = np.asarray([m.index(True) for m in masks], np.int32)
        check_docs = ruler_docs(RULER_TASK, str(tok_dir), length, args.check_n, CHECK_SEED)
        check = [probe_data.ProbeExample(key, probe_data.ruler_prompt(d), "") for d in check_docs]
        prompts = [tokenizer.encode(e.prompt, add_special_tokens=False) for e in check]
        arrays[f"check/{key}/ids"], arrays[f"check/{key}/offsets"] = _flat(prompts)
        answers[key] = [[str(o) for o in d["outputs"]] for d in check_docs]
        tf.log(f"{key}: {len(train)} training items, {len(check)} check items "
               f"({time.perf_counter() - t0:.0f}s)")
    for doc in make_docs(3, CARRY_TRAIN_SEED):  # the prompt rebuilt in train is lm-eval's
        assert carry_prompt(doc) == probe_data.carry_chain_prompt(doc)
    np.savez_compressed(out / "probes.npz", **arrays)
    archive = gutenberg.gutenberg_archive(args.cache)
    (out / "gutenberg").mkdir(exist_ok=True)
    shutil.copy2(archive, out / "gutenberg" / archive.name)
    meta = {"ruler_task": RULER_TASK, "lengths": list(LENGTHS), "train_items": args.n,
            "train_seed": TRAIN_SEED, "check_items": args.check_n, "check_seed": CHECK_SEED,
            "answers": answers, "tokenizer_md5": digests.pop()}
    (out / "meta.json").write_text(json.dumps(meta) + "\n")
    sizes = {p.name: p.stat().st_size for p in out.rglob("*") if p.is_file()}
    tf.log(f"wrote {out}: " + ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in sorted(sizes.items())))
    return 0


# ----------------------------------------------------------------------------- data


class ProbePool:
    """Encoded probe examples of one kind: token ids and the index where the completion starts."""

    def __init__(self, name: str, seqs: list[np.ndarray], prompt_len: list[int]):
        self.name, self.seqs, self.prompt_len = name, seqs, prompt_len

    @classmethod
    def from_npz(cls, data, key: str) -> ProbePool:
        ids, offsets = data[f"train/{key}/ids"], data[f"train/{key}/offsets"]
        seqs = [ids[offsets[i]:offsets[i + 1]].astype(np.int64) for i in range(len(offsets) - 1)]
        return cls(key, seqs, [int(x) for x in data[f"train/{key}/prompt_len"]])

    @classmethod
    def carry_chain(cls, tok, n: int, seed: int, rule: str = "table") -> ProbePool:
        cc = carry_chain_module()
        docs = list(cc.make_docs(n, seed, cc.CarryChainDifficulty(rule=rule)))
        prompts = tok.encode_batch([carry_prompt(d) for d in docs], add_special_tokens=False)
        comps = tok.encode_batch([" " + d["solution"] for d in docs], add_special_tokens=False)
        eos = tok.token_to_id(tf.SPECIALS[2])
        seqs = [np.asarray(p.ids + c.ids + [eos], np.int64) for p, c in zip(prompts, comps, strict=True)]
        return cls("carry_chain", seqs, [len(p.ids) for p in prompts])

    def packed(self, rng: random.Random, window: int) -> tuple[np.ndarray, np.ndarray]:
        """Random examples back to back while they fit ``window + 1`` tokens, then padding;
        the mask marks completion tokens."""
        ids = np.full(window + 1, PAD, np.int64)
        mask = np.zeros(window + 1, np.float32)
        pos = 0
        while True:
            i = rng.randrange(len(self.seqs))
            seq = self.seqs[i][: window + 1 - pos]
            if pos and len(seq) < len(self.seqs[i]):
                break
            ids[pos:pos + len(seq)] = seq
            mask[pos + self.prompt_len[i]:pos + len(seq)] = 1.0
            pos += len(seq)
            if pos >= window + 1:
                break
        return ids, mask


class ShortNeedlePool(ProbePool):
    """RULER ``niah_single_1`` items cut to ``lines`` haystack lines with a fresh random
    number: the retrieval curriculum's short stage. Built from the training items' text (the
    instruction, filler, needle and question lines RULER wrote), so prompts keep the exact
    format of the evaluation, only shorter; a new 7-digit number per draw stops the model
    from memorising needles."""

    def __init__(self, tok, source: ProbePool, lines: tuple[int, int], n_templates: int = 500):
        self.name, self.tok, self.lines = "short_niah", tok, lines
        self.templates = []
        for seq, plen in zip(source.seqs[:n_templates], source.prompt_len[:n_templates], strict=True):
            text = tok.decode(seq[:plen].tolist())
            rows = text.split("\n")
            needle = next(i for i, r in enumerate(rows) if re.search(r" is: \d+\.$", r))
            filler = [r for i, r in enumerate(rows[1:-1], 1) if i != needle]
            needle_fmt = re.sub(r"\d+\.$", "{}.", rows[needle])
            self.templates.append((rows[0], max(set(filler), key=filler.count), needle_fmt, rows[-1]))
        self.eos = tok.token_to_id(tf.SPECIALS[2])

    def draw(self, rng: random.Random) -> tuple[np.ndarray, int]:
        head, filler, needle, question = rng.choice(self.templates)
        n = rng.randint(*self.lines)
        number = str(rng.randrange(1_000_000, 10_000_000))
        body = [filler] * n
        body.insert(rng.randint(0, n), needle.format(number))
        prompt = self.tok.encode("\n".join([head, *body, question]), add_special_tokens=False).ids
        comp = self.tok.encode(" " + number + ".", add_special_tokens=False).ids + [self.eos]
        return np.asarray(prompt + comp, np.int64), len(prompt)

    def packed(self, rng: random.Random, window: int) -> tuple[np.ndarray, np.ndarray]:
        ids = np.full(window + 1, PAD, np.int64)
        mask = np.zeros(window + 1, np.float32)
        pos = 0
        while True:
            seq, plen = self.draw(rng)
            if pos + len(seq) > window + 1:
                break
            ids[pos:pos + len(seq)] = seq
            mask[pos + plen:pos + len(seq)] = 1.0
            pos += len(seq)
        return ids, mask


# Probe kinds and their shares of the probe sequences per stage: (end of the stage as a share
# of training, window, kinds). Retrieval starts short (RULER's format, a few filler lines)
# where a copy from context is found in hundreds of steps, then moves to the full lengths.
STAGES = [
    (0.3, 2048, {"short_niah": 0.5, f"{RULER_TASK}@2048": 0.15, "carry_chain": 0.35}),
    (0.6, 2048, {f"{RULER_TASK}@2048": 0.4, "short_niah": 0.15, "carry_chain": 0.45}),
    (1.0, 4096, {f"{RULER_TASK}@4096": 0.4, f"{RULER_TASK}@2048": 0.15, "carry_chain": 0.45}),
]
# A continuation that has learnt retrieval: mostly carry chains (each of 48 lookups must be
# right), retrieval kept in the mix so that it is not forgotten.
CARRY_STAGES = [
    (0.5, 2048, {"carry_chain": 0.7, f"{RULER_TASK}@2048": 0.15, "short_niah": 0.15}),
    (1.0, 4096, {"carry_chain": 0.6, f"{RULER_TASK}@4096": 0.25, f"{RULER_TASK}@2048": 0.15}),
]
STAGE_SETS = {"curriculum": STAGES, "carry": CARRY_STAGES}


def stage_at(frac: float, stages=STAGES) -> tuple[int, dict[str, float]]:
    """The window and probe shares at ``frac`` of training."""
    for end, window, kinds in stages:
        if frac < end:
            return window, kinds
    return stages[-1][1], stages[-1][2]


def make_batch(pools: dict[str, ProbePool], stream: torch.Tensor, window: int, batch: int,
               mix: float, rng: random.Random, gen: torch.Generator, kinds: dict[str, float]):
    """``batch`` sequences of ``window + 1`` tokens: play windows first, then packed probe
    sequences; also the number of play rows."""
    n_probe = int(mix * batch) + (1 if rng.random() < mix * batch - int(mix * batch) else 0)
    names, weights = zip(*kinds.items(), strict=True)
    rows, masks = [], []
    starts = torch.randint(0, stream.numel() - window - 1, (batch - n_probe,), generator=gen)
    for s in starts.tolist():
        rows.append(stream[s:s + window + 1].numpy())
        masks.append(np.ones(window + 1, np.float32))
    for _ in range(n_probe):
        ids, mask = pools[rng.choices(names, weights)[0]].packed(rng, window)
        rows.append(ids)
        masks.append(mask)
    return torch.from_numpy(np.stack(rows)), torch.from_numpy(np.stack(masks)), batch - n_probe


# ----------------------------------------------------------------------------- checks


def check_items(data, meta: dict, n: int) -> dict[str, list[tuple[np.ndarray, list[str]]]]:
    """The held-out RULER check items (seed 0, ``eval``'s items): prompt ids and answers."""
    out = {}
    for key, answers in meta["answers"].items():
        ids, offsets = data[f"check/{key}/ids"], data[f"check/{key}/offsets"]
        out[key] = [(ids[offsets[i]:offsets[i + 1]].astype(np.int64), answers[i])
                    for i in range(min(n, len(answers)))]
    return out


def selection_items(pools: dict[str, ProbePool], tok, n: int) -> dict[str, list]:
    """``n`` RULER training items per length taken out of the pools before training: the
    checkpoint is chosen on these, so the reported check items (seed 0) stay unseen."""
    out = {}
    for key, pool in pools.items():
        if key == "carry_chain":
            continue
        items = []
        for _ in range(n):
            seq, plen = pool.seqs.pop(), pool.prompt_len.pop()
            items.append((seq[:plen], [tok.decode(seq[plen:-1].tolist()).strip().rstrip(".")]))
        out[key] = items
    return out


@torch.no_grad()
def check_accuracy(model, tok, items: dict, n_carry: int, carry_seed: int, device,
                   carry_terms: int = 48, quiet: bool = False, carry_rule: str = "table") -> dict:
    """fp32 greedy accuracy: the needle in the first 16 generated tokens (RULER's
    ``string_match_all``) and the boxed carry-chain answer (problems of ``carry_seed``)."""
    was_training = model.training
    model.eval()
    eos = tok.token_to_id(tf.SPECIALS[2])
    kw = {"do_sample": False, "eos_token_id": eos, "pad_token_id": PAD}
    out = {}
    for key, pairs in items.items():
        right = 0
        for prompt, answers in pairs:
            x = torch.tensor(prompt, device=device)[None]
            gen = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=16, **kw)
            text = tok.decode(gen[0, x.shape[1]:].tolist())
            right += all(a in text for a in answers)
        out[key] = {"n": len(pairs), "correct": right, "accuracy": right / max(1, len(pairs))}
        if not quiet:
            tf.log(f"check {key}: {right}/{len(pairs)}")
    n = n_carry
    cc = carry_chain_module()
    docs = list(cc.make_docs(n, carry_seed, cc.CarryChainDifficulty(carry_terms, carry_rule)))
    right = 0
    batch = 50
    for b in range(0, len(docs), batch):
        group = docs[b:b + batch]
        enc = [tok.encode(carry_prompt(d), add_special_tokens=False).ids for d in group]
        assert len({len(e) for e in enc}) == 1, "carry-chain prompts of one batch differ in length"
        budget = max(len(tok.encode(" " + d["solution"], add_special_tokens=False).ids) for d in group)
        x = torch.tensor(enc, device=device)
        gen = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=budget + 32, **kw)
        for d, row in zip(group, gen[:, x.shape[1]:].tolist(), strict=True):
            got = re.findall(r"\\boxed\{(\d+)\}", tok.decode(row))
            right += bool(got) and got[-1] == d["answer"]
    out["carry_chain"] = {"n": len(docs), "correct": right, "accuracy": right / max(1, len(docs))}
    if not quiet:
        tf.log(f"check carry_chain: {right}/{len(docs)}")
    model.train(was_training)
    return out


TARGETS = {f"{RULER_TASK}@2048": 0.8, f"{RULER_TASK}@4096": 0.8, "carry_chain": 0.5}


def probe_score(acc: dict) -> float:
    """How close a checkpoint is to every target at once: the worst accuracy / target ratio,
    capped at 1.25 per task so that a strong task cannot hide a weak one."""
    return min(min(acc[k]["accuracy"] / t, 1.25) for k, t in TARGETS.items())


def probe_rank(acc: dict) -> tuple[float, float]:
    """Checkpoint order: :func:`probe_score`, ties (all at 0 while one task is not learnt yet)
    broken by the mean capped ratio, so progress on the other tasks is kept."""
    ratios = [min(acc[k]["accuracy"] / t, 1.25) for k, t in TARGETS.items()]
    return min(ratios), sum(ratios) / len(ratios)


# ----------------------------------------------------------------------------- train


def load_fixture(name: str, folder: Path, device):
    from transformers import NemotronHForCausalLM, Qwen3_5ForCausalLM

    cls = NemotronHForCausalLM if name == "nemotron-h-tiny" else Qwen3_5ForCausalLM
    model = cls.from_pretrained(folder, dtype=torch.float32)
    return apply_attention_window(model).to(device)


def set_window(model, window: int | None) -> None:
    """Limit the attention layers to the last ``window`` tokens (``--attention-window``); the
    window is saved in the config, so the shipped model loads with it."""
    if window is None:
        return
    model.config.sliding_window = window
    apply_attention_window(model)


SHIPPED_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "generation_config.json")


def write_config(model, init: Path, out: Path) -> None:
    """``config.json`` (the init's, plus the attention window) and the tokenizer files, so
    that ``out`` is a complete fixture folder (and a valid ``--init-from``)."""
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((init / "config.json").read_text())
    window = getattr(model.config, "sliding_window", None)
    if window:
        config["sliding_window"] = int(window)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for f in SHIPPED_FILES:
        if (init / f).is_file() and init.resolve() != out.resolve():
            shutil.copy2(init / f, out / f)


def _teacher(name: str, args, device):
    """The frozen plays model the plays rows are distilled from (``--teacher-from``)."""
    teacher = load_fixture(name, Path(args.teacher_from) / name, device)
    teacher.eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher


def batch_loss(model, teacher, seqs, masks, n_plays: int, autocast) -> torch.Tensor:
    """Mean over sequences of each sequence's mean per-token loss: KL from the teacher on play
    rows (``teacher`` given; cross-entropy on the text otherwise), cross-entropy on the
    completion tokens of probe rows."""
    with autocast():
        logits = model(input_ids=seqs[:, :-1], use_cache=False).logits.float()
    nll = F.cross_entropy(logits.flatten(0, 1), seqs[:, 1:].flatten(), reduction="none")
    per_tok = nll.view(seqs.shape[0], -1)
    if teacher is not None and n_plays:
        with torch.no_grad(), autocast():
            t_logits = teacher(input_ids=seqs[:n_plays, :-1], use_cache=False).logits.float()
        t_logp = F.log_softmax(t_logits, -1)
        kl = (t_logp.exp() * (t_logp - F.log_softmax(logits[:n_plays], -1))).sum(-1)
        per_tok = torch.cat([kl, per_tok[n_plays:]])
    m = masks[:, 1:]
    return ((per_tok * m).sum(1) / m.sum(1).clamp(min=1)).mean()


def save_model(model, out: Path) -> None:
    """bf16 ``model.safetensors`` into ``out`` (what the fixtures ship)."""
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.bfloat16) for k, v in model.state_dict().items()}
    with tempfile.TemporaryDirectory() as tmp:
        shipped = type(model)(model.config)
        shipped.load_state_dict(state)
        shipped.to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True)
        shutil.copy2(Path(tmp) / "model.safetensors", out / "model.safetensors")


_STEP = re.compile(r"\] (\S+): step (\d+) \((\d+)\) loss \S+ gnorm \S+ lr \S+ (\d+)s")
_SELECT = re.compile(r"\] (\S+): step (\d+) plays val ([\d.]+), selection (.*) \(score")
_DEVICE = re.compile(r"^(NVIDIA [^,]+),")


def run_from_log(log: Path, name: str, batch: int):
    """What a cut-off run did, from its log: validation history, last logged step, steps per
    window, tokens, seconds and the best selection (the checkpoint the run saved)."""
    history, phase, best, step, wall, last_window = [], {2048: 0, 4096: 0}, None, 0, 0.0, 2048
    for line in log.read_text().splitlines():
        if m := _STEP.search(line):
            if m.group(1) != name:
                continue
            s, w = int(m.group(2)), int(m.group(3))
            phase[last_window] += s - step
            step, wall, last_window = s, float(m.group(4)), w
        elif m := _SELECT.search(line):
            if m.group(1) != name:
                continue
            acc = {k: {"accuracy": float(v.rstrip("%")) / 100} for k, v in
                   (part.rsplit(" ", 1) for part in m.group(4).split(", "))}
            entry = {"step": int(m.group(2)), "val_nats_per_token": float(m.group(3)),
                     "selection": {k: v["accuracy"] for k, v in acc.items()}}
            history.append(entry)
            rank = probe_rank(acc)
            if best is None or rank > best["rank"]:
                best = {"step": entry["step"], "score": rank[0], "rank": rank, "state": None}
    if best is None:
        raise SystemExit(f"{log}: no selection line for {name}; nothing was saved")
    tokens = phase[2048] * batch * 2048 + phase[4096] * max(1, batch // 2) * 4096
    return history, step, phase, tokens, wall, best


def train_one(name: str, args, tok, corpus, data, meta) -> None:
    device = torch.device(args.device)
    init = Path(args.init_from) / name
    card = json.loads((init / "card.json").read_text())
    before = card.get("probe_training", {}).get("held_out_bits_per_byte_before",
                                                card["held_out_eval"]["bits_per_byte"])
    tf.set_seed(args.seed)
    model = load_fixture(name, init, device)
    set_window(model, args.attention_window)
    model.train()
    teacher = _teacher(name, args, device) if args.plays_loss == "kl" else None
    long_heads = {int(k): v for k, v in card["training"]["long_heads_at_init"].items()}
    hooks = tf.add_residual_dropout(model, args.dropout)
    hooks += tf.freeze_long_decay(model, long_heads)
    pools = {k: ProbePool.from_npz(data, k) for k in (f"{RULER_TASK}@{n}" for n in LENGTHS)}
    select = selection_items(pools, tok, args.select_n)
    t0 = time.perf_counter()
    pools["carry_chain"] = ProbePool.carry_chain(tok, args.carry_pool, CARRY_TRAIN_SEED, args.carry_rule)
    pools["short_niah"] = ShortNeedlePool(tok, pools[f"{RULER_TASK}@{LENGTHS[0]}"], (2, 24))
    tf.log(f"{name}: {args.carry_pool} carry-chain problems encoded ({time.perf_counter() - t0:.0f}s); "
           f"pools " + ", ".join(f"{k} {len(getattr(p, 'seqs', []))}" for k, p in pools.items()))
    use_bf16 = device.type == "cuda"

    def autocast():
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_bf16)

    opt_kw = {"fused": True} if device.type == "cuda" else {}
    opt = torch.optim.AdamW(tf.param_groups(model, args.weight_decay), lr=args.lr,
                            betas=(0.9, 0.95), eps=1e-8, **opt_kw)
    rng = random.Random(f"probe-train:{name}:{args.seed}")
    gen = torch.Generator().manual_seed(args.seed + 1)
    budget = args.minutes * 60.0
    step, tokens_seen, phase_steps = 0, 0, {2048: 0, 4096: 0}
    base_val = tf.val_loss(model, corpus, LENGTHS[0], device, args.val_windows, autocast)
    limit = base_val * (1 + args.val_tolerance)
    history = [{"step": 0, "val_nats_per_token": base_val, "seconds": 0.0}]
    best = {"step": None, "score": -1.0, "rank": (-1.0, -1.0), "state": None}
    out = Path(args.out) / name
    write_config(model, init, out)
    attn_window = getattr(model.config, "sliding_window", None)
    tf.log(f"{name}: plays val {base_val:.4f} nats/token before; keeping checkpoints <= {limit:.4f}"
           + (f"; attention window {attn_window} tokens" if attn_window else ""))

    def checkpoint(elapsed: float) -> bool:
        """Plays validation, then (within the limit) the selection check; keeps the best
        checkpoint on disk at once. True when every selection target is met with margin."""
        vl = tf.val_loss(model, corpus, LENGTHS[0], device, args.val_windows, autocast)
        entry = {"step": step, "val_nats_per_token": vl, "seconds": elapsed}
        history.append(entry)
        if vl > limit:
            tf.log(f"{name}: step {step} plays val {vl:.4f} > {limit:.4f}: not a candidate")
            return False
        acc = check_accuracy(model, tok, select, args.select_n, SELECT_CARRY_SEED, device, quiet=True,
                             carry_rule=args.carry_rule)
        rank = probe_rank(acc)
        score = rank[0]
        entry["selection"] = {k: v["accuracy"] for k, v in acc.items()}
        tf.log(f"{name}: step {step} plays val {vl:.4f}, selection "
               + ", ".join(f"{k} {v['accuracy']:.0%}" for k, v in acc.items()) + f" (score {score:.2f})")
        if rank > best["rank"]:
            best.update(step=step, score=score, rank=rank,
                        state={k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()})
            save_model(model, out)
        return score >= args.stop_score

    t_start = last_val = time.perf_counter()
    if args.finish_log:
        # a run the device cut off: its best checkpoint (already saved) and its log
        model.load_state_dict(load_fixture(name, Path(args.finish_from) / name, device).state_dict())
        history, step, phase_steps, tokens_seen, wall, best = run_from_log(
            Path(args.finish_log), name, args.batch_size)
        tf.log(f"{name}: finishing the run of {args.finish_log}: {step} steps, selected step "
               f"{best['step']} (weights from {args.finish_from})")
    else:
        while True:
            elapsed = time.perf_counter() - t_start
            frac = step / args.steps if args.steps else elapsed / budget
            if frac >= 1.0:
                break
            window, kinds = stage_at(frac, STAGE_SETS[args.stages])
            batch = args.batch_size if window == LENGTHS[0] else max(1, args.batch_size // 2)
            warm = min(1.0, (step + 1) / args.warmup)
            lr = args.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
            for group in opt.param_groups:
                group["lr"] = lr
            seqs, masks, n_plays = make_batch(pools, corpus.train, window, batch, args.probe_mix,
                                              rng, gen, kinds)
            loss = batch_loss(model, teacher, seqs.to(device), masks.to(device), n_plays, autocast)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            phase_steps[window] += 1
            tokens_seen += seqs[:, :-1].numel()
            if step % args.log_every == 0 or step == 1:
                tf.log(f"{name}: step {step} ({window}) loss {loss.item():.4f} gnorm {gnorm.item():.2f} "
                       f"lr {lr:.2e} {time.perf_counter() - t_start:.0f}s")
            if time.perf_counter() - last_val > args.val_seconds:
                if checkpoint(time.perf_counter() - t_start):
                    tf.log(f"{name}: selection targets met at step {step}: stopping")
                    break
                last_val = time.perf_counter()
        wall = time.perf_counter() - t_start
        if not history[-1]["step"] == step:
            checkpoint(wall)
        if best["state"] is None:
            tf.log(f"{name}: no checkpoint within the plays limit; shipping the last step")
            best.update(step=step, state=None)
        else:
            tf.log(f"{name}: selected step {best['step']} (score {best['score']:.2f})")
            model.load_state_dict(best["state"])
    for h in hooks:
        h.remove()
    model.to(torch.bfloat16).to(torch.float32)  # evaluate what is shipped
    metrics = tf.evaluate(model, tok, corpus, LENGTHS[0], device)
    tf.log(f"{name}: held-out {metrics['bits_per_byte']:.4f} bits/byte (before {before:.4f}, "
           f"{metrics['bits_per_byte'] / before - 1:+.2%})")
    acc = check_accuracy(model, tok, check_items(data, meta, args.check_n), args.check_n,
                         CHECK_SEED, device, carry_rule=args.carry_rule)
    tf.log(f"{name}: fp32 greedy accuracy " + ", ".join(f"{k} {v['accuracy']:.0%}" for k, v in acc.items()))
    gpu = torch.cuda.get_device_name(0) if device.type == "cuda" else None
    card["held_out_eval"] = {k: v for k, v in metrics.items() if k != "decay_spectrum"}
    card["decay_spectrum"] = metrics["decay_spectrum"]
    card["heads_ge_0999"] = sum(r["heads_ge_0999"] for r in metrics["decay_spectrum"])
    runs = card.get("probe_training", {}).get("runs", [])
    runs.append({
        "init": Path(os.path.relpath(Path(args.init_from).resolve(), ROOT)).as_posix(),
        "stages": args.stages, "steps": step, "attention_window": attn_window,
        "carry_rule": args.carry_rule,
        # a finished cut-off run trained elsewhere: its kernel is not this process's
        **({"gdn_kernel": args.gdn_kernel} if name == "qwen3.5-tiny" and not args.finish_log else {}),
        "selected_step": best["step"],
        "steps_per_window": {str(k): v for k, v in phase_steps.items()},
        "batch_size": {str(LENGTHS[0]): args.batch_size, str(LENGTHS[1]): max(1, args.batch_size // 2)},
        "lr": args.lr, "warmup_steps": args.warmup, "schedule": "cosine over the budget to 0.1x",
        "residual_dropout": args.dropout, "tokens_seen": tokens_seen, "wall_seconds": wall,
        "minutes_budget": args.minutes,
        "device": args.finish_device or gpu or platform.processor() or "cpu",
        "precision": "bf16 autocast, fp32 master weights" if gpu or args.finish_device else "fp32",
        "torch": torch.__version__, "val_history": history,
        **({"cut_off": "the device's time limit ended the call before this script's own "
                       "check; steps, history and selection are read from its log, the check "
                       "below ran afterwards (train --finish-log)"} if args.finish_log else {}),
    })
    card["probe_training"] = {
        "init": "the weights of the plays-only training above (same tokenizer)",
        "held_out_bits_per_byte_before": before,
        "attention_window": attn_window,
        "data": {"probe_mix": args.probe_mix,
                 "stages": {name: {f"until {end:g}": {"window": w, **kinds} for end, w, kinds in st}
                            for name, st in STAGE_SETS.items()},
                 "ruler_items": {k: len(p.seqs) for k, p in pools.items() if k.startswith(RULER_TASK)},
                 "short_niah_lines": list(pools["short_niah"].lines),
                 "ruler_seed": meta["train_seed"], "carry_chain_problems": args.carry_pool,
                 "carry_chain_seed": CARRY_TRAIN_SEED, "carry_chain_terms": 48,
                 "carry_chain_rule": args.carry_rule},
        "loss": ("plays: KL from the plays-only model per token" if teacher is not None
                 else "plays: cross-entropy on every token")
                + "; probe sequences: completion tokens; mean per sequence",
        "selection": {"items_per_ruler_length": args.select_n, "carry_chain_seed": SELECT_CARRY_SEED,
                      "rule": "best min(accuracy / target) among checkpoints whose plays "
                              f"validation loss rose at most {args.val_tolerance:.0%}",
                      "targets": TARGETS},
        "runs": runs,
        "check": {"seed": CHECK_SEED, "dtype": "float32 (bf16-stored weights)", "decoding": "greedy",
                  "accuracy": acc},
    }
    save_model(model, out)
    (out / "card.json").write_text(json.dumps(card, indent=1) + "\n")
    (out / "card.md").write_text(tf.card_markdown(card, model.config))
    tf.log(f"{name}: wrote {out}")


def _gdn_kernels(args) -> str:
    """FLA (``--fla-gdn``, after its check), else the compiled (``--compile-gdn``) or plain
    torch reference: never FLA's guarded backward unchecked. Returns what is used."""
    if args.fla_gdn:
        config = json.loads((Path(args.init_from) / "qwen3.5-tiny" / "config.json").read_text())
        shapes = {"heads": config["linear_num_value_heads"], "dk": config["linear_key_head_dim"],
                  "dv": config["linear_value_head_dim"]}
        if used := gdn.use_fla(torch.device(args.device), tf.log, **shapes):
            return used
    return gdn.compile_reference(tf.log) if args.compile_gdn else gdn.use_reference()


def train(args) -> int:
    from tokenizers import Tokenizer

    data_dir = Path(args.data)
    meta = json.loads((data_dir / "meta.json").read_text())
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    for name in names:
        if name not in tf.MODELS:
            raise SystemExit(f"unknown model {name!r}; choose from {tf.MODELS}")
    tok_file = Path(args.init_from) / names[0] / "tokenizer.json"
    if _md5(tok_file) != meta["tokenizer_md5"]:
        raise SystemExit(f"{tok_file} is not the tokenizer {data_dir} was prepared with")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    tf.install_fast_mamba2_scan()
    args.gdn_kernel = _gdn_kernels(args) if "qwen3.5-tiny" in names else None
    tok = Tokenizer.from_file(str(tok_file))
    gut = tf._gutenberg()
    train_texts, held_texts = gut.split_plays(data_dir / "gutenberg")
    corpus = tf.build_corpus(tok, train_texts, held_texts)
    data = dict(np.load(data_dir / "probes.npz"))
    tf.log(f"data: {corpus.train.numel():,} play tokens, probes from {data_dir} on {args.device}")
    for name in names:
        train_one(name, args, tok, corpus, data, meta)
    return 0


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    pr = sub.add_parser("prepare", help="write the probe data folder (CPU, needs lm-eval)")
    pr.add_argument("--out", default=str(DEFAULT_DATA))
    pr.add_argument("-n", type=int, default=3000, help="RULER training items per length")
    pr.add_argument("--check-n", type=int, default=100, help="held-out check items per length")
    pr.add_argument("--cache", default=None, help="Gutenberg cache folder")
    t = sub.add_parser("train", help="continue training the fixtures on plays + probes")
    t.add_argument("--data", default=str(DEFAULT_DATA), help="folder written by prepare")
    t.add_argument("--models", default=",".join(tf.MODELS))
    t.add_argument("--init-from", default=str(tf.DEFAULT_OUT),
                   help="fixtures folder to start from (<init-from>/<model>/; default: the shipped)")
    t.add_argument("--out", default=str(tf.DEFAULT_OUT), help="writes <out>/<model>/{model.safetensors,"
                   "card.json,card.md}")
    t.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    t.add_argument("--minutes", type=float, default=5.5, help="training time per model")
    t.add_argument("--steps", type=int, default=None, help="fixed step count instead of --minutes")
    t.add_argument("--probe-mix", type=float, default=0.5, help="share of probe sequences per batch")
    t.add_argument("--batch-size", type=int, default=None, help="at 2,048 (halved at 4,096); "
                   "default 16 on GPU, 2 on CPU")
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--warmup", type=int, default=30)
    t.add_argument("--weight-decay", type=float, default=0.1)
    t.add_argument("--dropout", type=float, default=0.1)
    t.add_argument("--carry-pool", type=int, default=6000, help="carry-chain training problems")
    t.add_argument("--check-n", type=int, default=100, help="held-out check items per task "
                   "(reported in the card)")
    t.add_argument("--select-n", type=int, default=24, help="items per task the checkpoint is "
                   "chosen on (RULER items taken out of training; carry-chain seed 202)")
    t.add_argument("--stop-score", type=float, default=1.2, help="stop once the selection "
                   "score (worst accuracy / target, capped at 1.25) reaches this")
    t.add_argument("--plays-loss", choices=("kl", "ce"), default="kl", help="plays rows: KL "
                   "from --teacher-from (keeps the plays model without overfitting its small "
                   "corpus) or cross-entropy on the text")
    t.add_argument("--teacher-from", default=str(tf.DEFAULT_OUT), help="fixtures folder of "
                   "the plays-only models (default: the shipped)")
    t.add_argument("--val-seconds", type=float, default=45.0, help="seconds between plays "
                   "validation + selection checks")
    t.add_argument("--val-windows", type=int, default=24)
    t.add_argument("--val-tolerance", type=float, default=0.04,
                   help="checkpoints whose plays validation loss rose more than this are not candidates")
    t.add_argument("--stages", choices=tuple(STAGE_SETS), default="curriculum", help="probe "
                   "mix over training: 'curriculum' (short needles first, then 2,048 and 4,096) "
                   "or 'carry' (mostly carry chains; for a continuation that already retrieves)")
    t.add_argument("--compile-gdn", action="store_true", help="train Qwen3.5's GDN layers "
                   "through torch.compile of transformers' chunked reference")
    t.add_argument("--fla-gdn", action="store_true", help="train and generate Qwen3.5's GDN "
                   "layers through FLA's kernels (fla-core installed), after comparing their "
                   "output and gradients with the reference on the device (tools/gdn_training.py); "
                   "the reference (--compile-gdn: compiled) when they differ")
    t.add_argument("--attention-window", type=int, default=None, help="limit the fixture's "
                   "attention to the last N tokens (saved as the config's sliding_window), so "
                   "that the probes' answers must pass through the SSM state")
    t.add_argument("--carry-rule", choices=("table", "shift"), default="table", help="carry-chain "
                   "step rule of the training, selection and check problems (evals: "
                   "--carry-rule)")
    t.add_argument("--finish-log", default=None, help="instead of training: finish a run the "
                   "device cut off, from its log and the checkpoint it saved in --finish-from "
                   "(held-out evaluation, check, card); the other options as that run had them")
    t.add_argument("--finish-from", default=None, help="with --finish-log: the folder the run "
                   "wrote (<finish-from>/<model>/)")
    t.add_argument("--finish-device", default=None, help="with --finish-log: the GPU the run "
                   "trained on (its nvidia-smi name)")
    t.add_argument("--log-every", type=int, default=50)
    t.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.command == "train" and bool(args.finish_log) != bool(args.finish_from):
        p.error("--finish-log and --finish-from go together")
    if args.command == "train" and args.batch_size is None:
        args.batch_size = 16 if torch.device(args.device).type == "cuda" else 2
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    return prepare(args) if args.command == "prepare" else train(args)


if __name__ == "__main__":
    sys.exit(main())
