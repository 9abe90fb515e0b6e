"""Teacher-forced KL drift of SSM-state precision configs against the FP32 reference.

For each document the reference runs once: the model's own exact FP32 forward (its chunked scan
keeps the SSM state in FP32; conventional FP32 decoding computes the same recurrence). Each
config then runs the same tokens with every SSM layer emulating its decode numerics after the
first ``prefill`` tokens (:func:`replayssm_quant.models.patch.patch_model`). Per evaluated
position ``t`` (the prediction of token ``t + 1``, ``prefill <= t < T - 1``) it records
KL(ref || cand) of the next-token distributions, whether the two top-1 tokens agree, the change
of the probability of the actual next token and both negative log-likelihoods.

The LM head and the KL run in chunks of positions, so a long document never holds a
``T x vocab`` tensor; the reference keeps only its final hidden states.

Every (document, config) result is one parquet file written atomically (temporary file +
:func:`os.replace`), named by a hash of everything it depends on, so an interrupted run picks up
where it stopped and a rerun with other settings never reuses a stale result. The reference of
a document is cached the same way until all its configs are done.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import platform
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd
import torch

from ..models.forward import decoder_hidden_states, lm_head_logits
from ..models.loading import load_model, module_device, output_device
from ..models.patch import patch_model
from ..models.registry import architecture, model_shape
from ..precision import PRESETS, PrecisionConfig, parse_config
from .data import PG19_REPO, PG19_SPLIT, Document, load_documents
from .decay import DecayRecorder
from .records import file_records
from .stats import drift_stats, log_buckets

__all__ = [
    "DEFAULT_CONFIGS",
    "DriftProgress",
    "DriftResult",
    "NaNLogitsError",
    "REFERENCES",
    "run_drift",
    "token_metrics",
]

log = logging.getLogger(__name__)

DEFAULT_CONFIGS: tuple[str, ...] = (
    "fp32", "shared-fp8", "shared-nvfp4", "nvfp4-read/fp32", "nvfp4-read/fp8-sr",
    "fp8-read/fp32",
)
"""Configs measured when none are given: the exact-emulation check (``fp32``), the paper's
shared baselines, and read copies (NVFP4 over an FP32 and an FP8-SR checkpoint, FP8 over FP32).
The conventional SR presets (``fp16-sr``, ``bf16-sr``) round the whole state every token and
cost about three times as much to emulate on a CPU; ask for them (or ``all``) explicitly."""

REFERENCES = ("exact", "fp32")
"""``exact``: the model's own FP32 forward (chunked scan). ``fp32``: the ``fp32`` preset's
decode emulation after the prefill (identical math, token-by-token summation order)."""

_SCHEMA_VERSION = 1
_LOGIT_CHUNK_ELEMENTS = 1 << 24  # 128 MiB of float64 log-probabilities per side per chunk


class NaNLogitsError(RuntimeError):
    """A run produced NaN (or infinite) logits: the emulated state overflowed or held NaN."""


class DriftProgress(Protocol):
    """What :func:`run_drift` reports while it works (the CLI draws a progress bar)."""

    def start(self, total_tokens: int) -> None: ...

    def advance(self, tokens: int, description: str) -> None: ...


# ----------------------------------------------------------------------------------- results
@dataclass
class DriftResult:
    """Outcome of :func:`run_drift`.

    ``per_document``: one row per document x config x bucket (bucket ``all`` included).
    ``pooled``: one row per config x bucket, over all documents. ``summary``: what
    ``summary.json`` holds. ``out_dir``: where the files are (None for an in-memory run).
    """

    model: str
    configs: list[str]
    per_document: pd.DataFrame
    pooled: pd.DataFrame
    summary: dict
    out_dir: Path | None = None
    files: dict[str, Path] = field(default_factory=dict)

    def table(self) -> pd.DataFrame:
        """Per config: mean KL per bucket, overall mean KL with CI, same-top-1, PPL ratio."""
        return _wide_table(self.pooled, self.configs)


# ----------------------------------------------------------------------------------- per token
@torch.no_grad()
def token_metrics(model: torch.nn.Module, h_ref: torch.Tensor, h_cand: torch.Tensor,
                  targets: torch.Tensor, *, chunk: int | None = None,
                  what: str = "candidate", positions: torch.Tensor | None = None
                  ) -> dict[str, np.ndarray]:
    """Per-position drift metrics from final hidden states ``(n, hidden)`` of both runs.

    The LM head and log-softmax run over ``chunk`` positions at a time (default: about 2^24
    logits), in float64 so tiny KLs are not rounding noise. Raises :class:`NaNLogitsError` at
    the first non-finite logit.
    """
    n = h_ref.shape[0]
    vocab = model.get_output_embeddings().weight.shape[0]
    step = chunk or max(1, min(n, _LOGIT_CHUNK_ELEMENTS // vocab))
    out = {k: [] for k in ("kl", "same_top1", "dp", "nll_ref", "nll")}
    for s in range(0, n, step):
        e = min(n, s + step)
        lr = _log_probs(model, h_ref[s:e], "reference", s, positions)
        lc = _log_probs(model, h_cand[s:e], what, s, positions)
        y = targets[s:e].to(lr.device)[:, None]
        kl = (lr.exp() * (lr - lc)).sum(-1)
        lr_y, lc_y = lr.gather(-1, y)[:, 0], lc.gather(-1, y)[:, 0]
        out["kl"].append(kl.cpu())
        out["same_top1"].append((lr.argmax(-1) == lc.argmax(-1)).cpu())
        out["dp"].append((lc_y.exp() - lr_y.exp()).cpu())
        out["nll_ref"].append((-lr_y).cpu())
        out["nll"].append((-lc_y).cpu())
    return {k: torch.cat(v).numpy() if v else np.zeros(0) for k, v in out.items()}


def _log_probs(model, h: torch.Tensor, what: str, offset: int,
               positions: torch.Tensor | None) -> torch.Tensor:
    logits = lm_head_logits(model, h)
    bad = ~torch.isfinite(logits)
    if bad.any():
        row = int(bad.any(-1).nonzero()[0, 0]) + offset
        pos = int(positions[row]) if positions is not None else row
        raise NaNLogitsError(f"NaN in the {what} logits at position {pos}")
    return torch.log_softmax(logits.double(), dim=-1)


# ----------------------------------------------------------------------------------- files
def _atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _write_json(path: Path, obj: Any) -> None:
    text = json.dumps(_json_safe(obj), indent=2, sort_keys=False) + "\n"
    _atomic_write(path, lambda p: p.write_text(text))


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return None if not math.isfinite(float(obj)) else float(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", s).strip("_")[:60] or "x"


def _digest(*parts: Any, n: int = 12) -> str:
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        h.update(p if isinstance(p, bytes) else str(p).encode())
        h.update(b"\0")
    return h.hexdigest()[:n]


def _model_fingerprint(model: torch.nn.Module) -> str:
    """Config, dtype and a sample of every parameter: enough to tell two checkpoints apart
    without hashing billions of weights."""
    h = hashlib.blake2b(digest_size=16)
    h.update(model.config.to_json_string(use_diff=False).encode())
    for name, p in model.named_parameters():
        h.update(name.encode())
        h.update(str(p.dtype).encode())
        h.update(p.detach().flatten()[:64].float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def _doc_seed(seed: int, doc_id: str) -> int:
    """Seed of the stochastic rounding for one document: independent streams per document, the
    same on every rerun regardless of order."""
    raw = hashlib.blake2b(f"{seed}:{doc_id}".encode(), digest_size=8).digest()
    return int.from_bytes(raw, "little") >> 1


# ----------------------------------------------------------------------------------- reference
@dataclass
class _Reference:
    hidden: torch.Tensor  # (n, hidden) at positions prefill .. T-2
    decay: dict


@torch.no_grad()
def _run_reference(model, ids: torch.Tensor, prefill: int, reference: str,
                   seed: int) -> _Reference:
    rec = DecayRecorder()
    P = prefill if reference == "fp32" else sys.maxsize
    with patch_model(model, PRESETS["fp32"], prefill=P, seed=seed, decay=rec):
        h = decoder_hidden_states(model, ids[None])[0]
    return _Reference(h[prefill: ids.numel() - 1].contiguous(), rec.state_dict())


@torch.no_grad()
def _run_candidate(model, ids: torch.Tensor, cfg: PrecisionConfig, prefill: int,
                   seed: int) -> torch.Tensor:
    with patch_model(model, cfg, prefill=prefill, seed=seed):
        h = decoder_hidden_states(model, ids[None])[0]
    return h[prefill: ids.numel() - 1].contiguous()


# ----------------------------------------------------------------------------------- run
@dataclass
class _Pair:
    doc: Document
    doc_key: str
    cfg: PrecisionConfig
    path: Path | None


def run_drift(
    model_or_name: torch.nn.Module | str,
    configs: Sequence[str | PrecisionConfig] = DEFAULT_CONFIGS,
    data: str | Sequence[Document] = "gutenberg",
    *,
    tokenizer: Any = None,
    max_tokens: int = 2048,
    docs: int = 1,
    prefill: int = 128,
    seed: int = 0,
    out: str | Path | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    reference: str = "exact",
    keep_reference: bool = False,
    model_name: str | None = None,
    pg19_repo: str = PG19_REPO,
    pg19_split: str = PG19_SPLIT,
    progress: DriftProgress | None = None,
    strict: bool = False,
    device_map: str | dict | None = None,
    select: Sequence[int] | None = None,
    pairs_only: bool = False,
) -> DriftResult:
    """Measure the teacher-forced KL drift of ``configs`` on ``data``.

    ``model_or_name``: a loaded model (pass its ``tokenizer`` unless ``data`` is a list of
    documents) or a name for :func:`~replayssm_quant.models.loading.load_model` (fixture, hub
    id, local folder, ``random:<model_type>``). ``data``: a spec for
    :func:`~replayssm_quant.evals.data.load_documents` or ready documents. With ``out`` every
    result is written there and a rerun resumes; without it nothing touches the disk.
    ``strict``: documents shorter than ``max_tokens`` (or fewer than ``docs``) are an error
    rather than a warning. ``device_map`` (a name only; see
    :func:`~replayssm_quant.models.loading.parse_device_map`) spreads the model's layers over
    several GPUs: each SSM layer emulates on its own layer's device, and the LM head and KL
    run where the final hidden states are.

    For a sweep, where several processes fill one ``out`` folder: ``select`` runs only these
    indexes of the loaded documents (the same documents as a full run, so the same files);
    ``pairs_only`` writes the (document, config) pair files and the references only, leaving
    the aggregate files to one later full call, and leaves other processes' temporary files
    alone. Its result has empty tables; ``files`` maps ``"<doc_id> <config>"`` to each pair
    file it computed now.
    """
    if reference not in REFERENCES:
        raise ValueError(f"reference must be one of {REFERENCES}, got {reference!r}")
    if prefill < 0:
        raise ValueError(f"prefill must be >= 0, got {prefill}")
    cfgs = _unique_configs(configs)
    if isinstance(model_or_name, str):
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        dt = dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
        model, tok = load_model(model_or_name, device=dev, dtype=dt, device_map=device_map)
        name = model_name or model_or_name
    else:
        model, tok = model_or_name, tokenizer
        name = model_name or str(getattr(model.config, "name_or_path", "") or
                                 type(model).__name__)
    architecture(model)
    shape = model_shape(model, name)
    model.eval()
    # under a device map the tokens enter at the embedding and the reference lives where the
    # decoder's final hidden states come out (one device otherwise: the model's)
    in_dev = module_device(model.get_input_embeddings())
    out_dev = output_device(model)

    if isinstance(data, str):
        if tok is None:
            raise ValueError("a data spec needs the model's tokenizer")
        documents = load_documents(data, tok, max_tokens=max_tokens, docs=docs,
                                   min_tokens=prefill + 2, model=model, seed=seed,
                                   pg19_repo=pg19_repo, pg19_split=pg19_split, strict=strict)
        data_label = data
    else:
        documents = [d for d in data if len(d) >= prefill + 2]
        if not documents:
            raise ValueError(f"no document has the {prefill + 2} tokens needed")
        data_label = "documents"
    if select is not None:
        if any(i < 0 or i >= len(documents) for i in select):
            raise ValueError(f"document index out of range: {list(select)} of "
                             f"{len(documents)} document(s)")
        documents = [documents[i] for i in select]

    out_dir = Path(out).expanduser() if out is not None else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        if not pairs_only:
            _clean_temporaries(out_dir)
    fingerprint = _model_fingerprint(model)

    pairs: list[_Pair] = []
    doc_keys: dict[str, str] = {}
    for doc in documents:
        tok_hash = _digest(doc.tokens.numpy().tobytes(), n=16)
        key = f"{_slug(doc.doc_id)}-" + _digest(_SCHEMA_VERSION, fingerprint, tok_hash, prefill,
                                                seed, reference)
        doc_keys[doc.doc_id] = key
        for cfg in cfgs:
            path = None
            if out_dir is not None:
                path = (out_dir / "pairs" / key /
                        f"{_slug(cfg.label)}-{_digest(str(cfg), n=8)}.parquet")
            pairs.append(_Pair(doc, key, cfg, path))

    results: dict[tuple[str, str], pd.DataFrame] = {}
    todo: dict[str, list[_Pair]] = {}
    for pair in pairs:
        if pair.path is not None and pair.path.is_file():
            results[(pair.doc.doc_id, pair.cfg.label)] = pd.read_parquet(pair.path)
        else:
            todo.setdefault(pair.doc.doc_id, []).append(pair)
    decays: dict[str, dict] = {}
    written: dict[str, Path] = {}
    for doc in documents:
        d = _load_decay(out_dir, doc_keys[doc.doc_id])
        if d is not None:
            decays[doc.doc_id] = d

    total = sum(len(d) * (len(p) + 1) for d in documents if (p := todo.get(d.doc_id)))
    total += sum(len(d) for d in documents if d.doc_id not in todo and d.doc_id not in decays)
    if progress is not None:
        progress.start(total)

    for doc in documents:
        key = doc_keys[doc.doc_id]
        missing = todo.get(doc.doc_id, [])
        if not missing and doc.doc_id in decays:
            if out_dir is not None and not keep_reference and not pairs_only:
                (out_dir / "reference" / f"{key}.pt").unlink(missing_ok=True)
            continue
        ids = doc.tokens.to(in_dev)
        ref = _load_reference(out_dir, key, out_dev)
        if ref is None:
            try:
                ref = _run_reference(model, ids, prefill, reference,
                                     _doc_seed(seed, doc.doc_id))
            except NaNLogitsError as exc:
                raise NaNLogitsError(f"{name} on {doc.doc_id}: reference: {exc}") from None
            if not torch.isfinite(ref.hidden).all():
                raise NaNLogitsError(f"{name} on {doc.doc_id}: NaN in the FP32 reference's "
                                     "hidden states")
            if missing:
                _save_reference(out_dir, key, ref)
        if out_dir is not None:
            _write_json(out_dir / "reference" / f"{key}.decay.json", ref.decay)
        decays[doc.doc_id] = ref.decay
        if progress is not None:
            progress.advance(len(doc), f"{name} · {doc.name} · reference")
        targets = doc.tokens[prefill + 1:]
        positions = torch.arange(prefill, len(doc) - 1)
        for pair in missing:
            label = pair.cfg.label
            h = _run_candidate(model, ids, pair.cfg, prefill, _doc_seed(seed, doc.doc_id))
            try:
                m = token_metrics(model, ref.hidden, h, targets, what=f"'{label}'",
                                  positions=positions)
            except NaNLogitsError as exc:
                raise NaNLogitsError(f"{name} with config {label} on {doc.doc_id}: {exc} "
                                     "(the emulated SSM state overflowed or holds NaN)") from None
            frame = pd.DataFrame({
                "pos": positions.numpy().astype(np.int32),
                "kl": m["kl"].astype(np.float64),
                "same_top1": m["same_top1"].astype(bool),
                "dp": m["dp"].astype(np.float64),
                "nll_ref": m["nll_ref"].astype(np.float64),
                "nll": m["nll"].astype(np.float64),
            })
            if pair.path is not None:
                _atomic_write(pair.path, lambda p, f=frame: f.to_parquet(p, index=False))
                written[f"{doc.doc_id} {label}"] = pair.path
            results[(doc.doc_id, label)] = frame
            if progress is not None:
                progress.advance(len(doc), f"{name} · {doc.name} · {label}")
        if out_dir is not None and not keep_reference:
            (out_dir / "reference" / f"{key}.pt").unlink(missing_ok=True)

    if pairs_only:
        return DriftResult(name, [c.label for c in cfgs], pd.DataFrame(), pd.DataFrame(), {},
                           out_dir, written)
    max_len = max(len(d) for d in documents)
    buckets = log_buckets(prefill, max_len - 1)
    per_doc, pooled = _aggregate(documents, cfgs, results, buckets)
    decay = DecayRecorder()
    for doc in documents:
        decay.merge(DecayRecorder.from_state_dict(decays[doc.doc_id]))
    summary = _summary(name, model, shape, data_label, documents, cfgs, pooled, buckets,
                       decay.spectrum(), max_tokens=max_tokens, prefill=prefill, seed=seed,
                       reference=reference)
    result = DriftResult(name, [c.label for c in cfgs], per_doc, pooled, summary, out_dir)
    if out_dir is not None:
        result.files = _write_outputs(result, buckets)
    return result


def _unique_configs(configs: Sequence[str | PrecisionConfig]) -> list[PrecisionConfig]:
    out: list[PrecisionConfig] = []
    seen: set[str] = set()
    for c in configs:
        cfg = parse_config(c)
        if cfg.label not in seen:
            seen.add(cfg.label)
            out.append(cfg)
    if not out:
        raise ValueError("no precision config given")
    return out


def _clean_temporaries(out_dir: Path) -> None:
    """Remove temporary files a killed run left behind (never a finished result)."""
    for p in out_dir.rglob(".*.tmp-*"):
        if p.is_file():
            p.unlink(missing_ok=True)


def _save_reference(out_dir: Path | None, key: str, ref: _Reference) -> None:
    if out_dir is None:
        return
    path = out_dir / "reference" / f"{key}.pt"
    _atomic_write(path, lambda p: torch.save({"hidden": ref.hidden.cpu(), "decay": ref.decay},
                                             p))


def _load_reference(out_dir: Path | None, key: str, device: torch.device) -> _Reference | None:
    if out_dir is None:
        return None
    path = out_dir / "reference" / f"{key}.pt"
    if not path.is_file():
        return None
    obj = torch.load(path, map_location=device, weights_only=True)
    return _Reference(obj["hidden"], obj["decay"])


def _load_decay(out_dir: Path | None, key: str) -> dict | None:
    if out_dir is None:
        return None
    path = out_dir / "reference" / f"{key}.decay.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text())


# ----------------------------------------------------------------------------------- aggregate
def _bucket_label(lo: int, hi: int) -> str:
    return f"[{lo},{hi})"


def _stats_rows(frame: pd.DataFrame, groups: np.ndarray | None,
                buckets: list[tuple[int, int]]) -> list[dict]:
    rows = []
    pos = frame["pos"].to_numpy()
    spans = [(_bucket_label(lo, hi), lo, hi) for lo, hi in buckets]
    spans.append(("all", buckets[0][0] if buckets else 0, buckets[-1][1] if buckets else 0))
    for label, lo, hi in spans:
        mask = (pos >= lo) & (pos < hi) if label != "all" else np.ones(len(pos), dtype=bool)
        if not mask.any():
            continue
        sub = frame[mask]
        g = groups[mask] if groups is not None else None
        s = drift_stats(sub["kl"].to_numpy(), sub["same_top1"].to_numpy(), sub["dp"].to_numpy(),
                        sub["nll_ref"].to_numpy(), sub["nll"].to_numpy(), groups=g)
        rows.append({"bucket": label, "lo": lo, "hi": hi} | s)
    return rows


def _aggregate(documents: list[Document], cfgs: list[PrecisionConfig],
               results: dict[tuple[str, str], pd.DataFrame],
               buckets: list[tuple[int, int]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    per_doc: list[dict] = []
    pooled: list[dict] = []
    for cfg in cfgs:
        frames = []
        for i, doc in enumerate(documents):
            f = results[(doc.doc_id, cfg.label)]
            for r in _stats_rows(f, None, buckets):
                per_doc.append({"doc_id": doc.doc_id, "doc_name": doc.name,
                                "config": cfg.label, "config_str": str(cfg)} | r)
            frames.append(f.assign(doc=i))
        allf = pd.concat(frames, ignore_index=True)
        for r in _stats_rows(allf, allf["doc"].to_numpy(), buckets):
            pooled.append({"config": cfg.label, "config_str": str(cfg)} | r)
    return pd.DataFrame(per_doc), pd.DataFrame(pooled)


def _versions() -> dict[str, str]:
    import transformers

    from .. import __version__

    out = {"replayssm_quant": __version__, "torch": torch.__version__,
           "transformers": transformers.__version__, "python": platform.python_version()}
    try:
        import datasets

        out["datasets"] = datasets.__version__
    except ImportError:
        pass
    return out


_STAT_KEYS = ("n", "kl_mean", "kl_se", "kl_ci_lo", "kl_ci_hi", "kl_median", "kl_p90", "kl_p95",
              "kl_p99", "kl_p99_9", "kl_max", "same_top1", "same_top1_lo", "same_top1_hi",
              "dp_mean", "dp_rms", "ppl_ref", "ppl", "ppl_ratio", "ppl_ratio_lo", "ppl_ratio_hi")


def _summary(name: str, model, shape, data_label: str, documents: list[Document],
             cfgs: list[PrecisionConfig], pooled: pd.DataFrame, buckets, spectrum: dict, *,
             max_tokens: int, prefill: int, seed: int, reference: str) -> dict:
    configs = []
    for cfg in cfgs:
        rows = pooled[pooled["config"] == cfg.label]
        overall = rows[rows["bucket"] == "all"]
        configs.append({
            "name": cfg.label, "config": str(cfg),
            "overall": {k: overall.iloc[0][k] for k in _STAT_KEYS} if len(overall) else {},
            "buckets": [{"bucket": r["bucket"], "lo": int(r["lo"]), "hi": int(r["hi"])}
                        | {k: r[k] for k in _STAT_KEYS}
                        for _, r in rows[rows["bucket"] != "all"].iterrows()],
        })
    dev = next(model.parameters())
    return {
        "model": name,
        "model_type": model.config.model_type,
        "ssm_shape": {"kind": shape.kind, "heads": shape.heads, "head_dim": shape.head_dim,
                      "d_state": shape.d_state, "groups": shape.groups, "layers": shape.layers,
                      "act_bytes": shape.act_bytes},
        "data": data_label,
        "documents": [{"doc_id": d.doc_id, "name": d.name, "tokens": len(d), "source": d.source}
                      for d in documents],
        "max_tokens": max_tokens,
        "prefill": prefill,
        "seed": seed,
        "reference": reference,
        "tokens": sum(len(d) for d in documents),
        "positions_per_config": sum(len(d) - 1 - prefill for d in documents),
        "buckets": [{"bucket": _bucket_label(lo, hi), "lo": lo, "hi": hi} for lo, hi in buckets],
        "configs": configs,
        "decay_spectrum": spectrum,
        "device": str(dev.device),
        "dtype": str(dev.dtype).replace("torch.", ""),
        "versions": _versions(),
    }


# ----------------------------------------------------------------------------------- outputs
def _fmt(x: float, digits: int = 3) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    if x == 0:
        return "0"
    if abs(x) < 1e-3 or abs(x) >= 1e4:
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}g}" if abs(x) < 1 else f"{x:.{digits + 1}g}"


def _wide_table(pooled: pd.DataFrame, configs: list[str]) -> pd.DataFrame:
    rows = []
    for label in configs:
        sub = pooled[pooled["config"] == label]
        row: dict[str, Any] = {"config": label}
        for _, r in sub[sub["bucket"] != "all"].iterrows():
            row[f"KL {r['bucket']}"] = r["kl_mean"]
        all_ = sub[sub["bucket"] == "all"]
        if len(all_):
            a = all_.iloc[0]
            row |= {"KL mean": a["kl_mean"], "KL ci_lo": a["kl_ci_lo"], "KL ci_hi": a["kl_ci_hi"],
                    "KL p99": a["kl_p99"], "KL max": a["kl_max"], "same top-1": a["same_top1"],
                    "PPL ratio": a["ppl_ratio"]}
        rows.append(row)
    return pd.DataFrame(rows)


def _markdown(result: DriftResult) -> str:
    s = result.summary
    docs = s["documents"]
    lines = [f"# Teacher-forced KL drift: {s['model']}", ""]
    lines.append(
        f"Data: `{s['data']}`, {len(docs)} document(s), {s['tokens']:,} tokens "
        f"(max {s['max_tokens']:,} each); prefill {s['prefill']} tokens (exact FP32 chunked "
        f"scan), then every SSM layer emulates the config's decode numerics; seed {s['seed']}. "
        f"Reference: {'the exact FP32 forward' if s['reference'] == 'exact' else 'fp32 decode'}. "
        f"{s['positions_per_config']:,} positions per config.")
    lines.append("")
    buckets = [b["bucket"] for b in s["buckets"]]
    head = ["config"] + [f"KL {b}" for b in buckets] + ["KL all (95% CI)", "KL p99",
                                                          "same top-1", "PPL ratio"]
    lines.append("Mean KL(ref ‖ config) in nats per position bucket (token index).")
    lines.append("")
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|")
    for c in s["configs"]:
        by = {b["bucket"]: b for b in c["buckets"]}
        o = c["overall"]
        cells = [f"`{c['name']}`"] + [_fmt(by[b]["kl_mean"]) if b in by else "–"
                                      for b in buckets]
        cells.append(f"{_fmt(o.get('kl_mean'))} ({_fmt(o.get('kl_ci_lo'))} – "
                     f"{_fmt(o.get('kl_ci_hi'))})")
        cells.append(_fmt(o.get("kl_p99")))
        st = o.get("same_top1")
        cells.append("–" if st is None or not math.isfinite(st) else f"{100 * st:.2f}%")
        cells.append(_fmt(o.get("ppl_ratio"), 4))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "CI: batch means over ~√n consecutive tokens per document (per-token KL is "
              "autocorrelated along a sequence). PPL ratio: exp(mean NLL(config) − mean "
              "NLL(reference)).", ""]
    sp = s["decay_spectrum"]
    lines.append("## Decay spectrum")
    lines.append("")
    fr = ", ".join(f"{k}: {100 * v:.1f}%" for k, v in sp["fraction_of_heads"].items())
    lines.append(f"Mean per-token decay of each SSM head on this text ({sp['heads']} heads; "
                 f"fraction of heads with mean decay {fr}). A shared narrow state feeds its "
                 "rounding error back through the decay, so long-memory heads (decay near 1) "
                 "drift most.")
    lines.append("")
    lines.append("| layer | kind | heads | min | median | max | memory of the longest head "
                 "(tokens) |")
    lines.append("|---:|---|---:|---:|---:|---:|---:|")
    for layer in sp["layers"]:
        m = np.asarray(layer["mean_decay"])
        lines.append(f"| {layer['layer']} | {layer['kind']} | {m.size} | {m.min():.4f} | "
                     f"{np.median(m):.4f} | {m.max():.4f} | {max(layer['memory_tokens']):,.0f} |")
    lines.append("")
    v = s["versions"]
    lines.append("Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()) +
                 f"; device {s['device']}, {s['dtype']}.")
    return "\n".join(lines) + "\n"


def _plot(result: DriftResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pooled = result.pooled[result.pooled["bucket"] != "all"]
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    positive = pooled["kl_mean"][pooled["kl_mean"] > 0]
    floor = float(positive.min()) / 10 if len(positive) else 1e-12
    zero: list[str] = []
    for label in result.configs:
        sub = pooled[pooled["config"] == label].sort_values("lo")
        if sub.empty:
            continue
        if not (sub["kl_mean"] > 0).any():
            zero.append(label)
            continue
        x = np.sqrt(sub["lo"].clip(lower=1).to_numpy() * sub["hi"].to_numpy())
        y = sub["kl_mean"].to_numpy()
        # a bucket with KL exactly 0 has no place on a log axis: leave a gap, not a fake value
        (line,) = ax.plot(x, np.where(y > 0, y, np.nan), marker="o", label=label)
        lo = np.nan_to_num(sub["kl_ci_lo"].to_numpy(), nan=floor).clip(min=floor)
        hi = np.nan_to_num(sub["kl_ci_hi"].to_numpy(), nan=floor).clip(min=floor)
        ok = y > 0
        ax.fill_between(x, np.where(ok, lo, np.nan), np.where(ok, hi, np.nan),
                        color=line.get_color(), alpha=0.18, linewidth=0)
    ax.set_xscale("log")
    if len(positive):
        ax.set_yscale("log")
    ax.set_xlabel("token position (bucket centre)")
    ax.set_ylabel("mean KL(ref ‖ config) [nats]")
    s = result.summary
    title = f"{s['model']}: teacher-forced drift (prefill {s['prefill']})"
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    if zero:
        ax.plot([], [], " ", label="KL = 0: " + ", ".join(zero))
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    _atomic_write(path, lambda p: fig.savefig(p, format="png"))
    plt.close(fig)


def _write_outputs(result: DriftResult, buckets) -> dict[str, Path]:
    out = result.out_dir
    assert out is not None
    files = {
        "per_document": out / "drift.parquet",
        "pooled": out / "drift_pooled.parquet",
        "summary": out / "summary.json",
        "markdown": out / "drift.md",
        "plot": out / "kl_vs_position.png",
    }
    _atomic_write(files["per_document"],
                  lambda p: result.per_document.to_parquet(p, index=False))
    _atomic_write(files["pooled"], lambda p: result.pooled.to_parquet(p, index=False))
    result.summary["files"] = file_records(out, ("drift.parquet", "drift_pooled.parquet"))
    _write_json(files["summary"], result.summary)
    md = _markdown(result)
    _atomic_write(files["markdown"], lambda p: p.write_text(md))
    _plot(result, files["plot"])
    return files
