"""Generation speed of the eval path (CPU or CUDA): tokens per second of greedy generation
through :class:`~replayssm_quant.models.decode.ReplayDecoder` (what ``eval --backend replayssm``
runs) under each precision config, against the model's own ``generate()`` on the same prompts in
the same process.

    python -m benchmarks.generation --models nemotron-h-tiny,qwen3.5-tiny --batch 1,8 \\
        --out reports/generation
    python -m benchmarks.generation --device cuda --batch 1,8,32 \\
        --models random:qwen3.5-4b,random:nemotron-3-nano-4b --out gen-gpu

Both sides generate exactly ``--new-tokens`` tokens per row from the same seeded random prompts
of ``--prompt-tokens`` tokens (``generate()`` with ``min_new_tokens = max_new_tokens`` and no
EOS, the decoder with no EOS ids), prefill included in the time. Each time is the fastest of
``--repeats`` runs after one short warm-up, the two sides alternating: on a shared machine the
fastest run is the one other work disturbed least (the JSON keeps every run's time).
``slowdown`` is replay time / ``generate()`` time (1.5: the replay path is 1.5x slower);
``match`` is the share of generated tokens equal to ``generate()``'s (1.0 expected for
``fp32``, up to numerical near-ties). On the CPU each run's process CPU time is kept too, and
``cpu slowdown`` compares the fastest runs by it: with one torch thread it counts this process's
own work, which other jobs on a shared machine disturb much less than the wall clock.

``random:qwen3.5-4b`` and ``random:nemotron-3-nano-4b`` are randomly initialised models with the
real layer shapes, cut to their first ``--layers`` layers (default: up to the first attention
layer), built on the device in ``--dtype``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import write_rows
from replayssm_quant.models.decode import ReplayDecoder
from replayssm_quant.precision import parse_config, split_configs

DEFAULT_CONFIGS = "fp32,replay-fp32,nvfp4-read/fp16-sr"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
COLUMNS = ("model", "config", "batch", "new_tokens", "replay_tok_s", "generate_tok_s",
           "slowdown", "cpu_slowdown", "match")


def _load(name: str, layers: int | None, device: str, dtype: torch.dtype):
    from replayssm_quant.models.loading import load_model
    from replayssm_quant.models.tiny import RANDOM_PREFIX, SHAPED_MODELS, shaped_model

    short = name[len(RANDOM_PREFIX):] if name.startswith(RANDOM_PREFIX) else None
    if short in SHAPED_MODELS:
        return shaped_model(short, layers, device=device, dtype=dtype)[0]
    return load_model(name, device=device, dtype=dtype)[0]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _prompts(vocab: int, batch: int, length: int, seed: int) -> torch.Tensor:
    """Seeded random prompt ids, the low ids (special tokens in the fixtures) left out."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (batch, length), generator=gen)


def _hf_generate(model, ids: torch.Tensor, n: int) -> torch.Tensor:
    from transformers import GenerationConfig

    gc = GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None,
                          bos_token_id=None, pad_token_id=0)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gc)
    return out[:, ids.shape[1]:]


def _replay_generate(decoder: ReplayDecoder, prompts: list[list[int]], n: int) -> torch.Tensor:
    gens = decoder.generate(prompts, max_new_tokens=n)
    return torch.tensor([g.tokens for g in gens])


def _timed(fn, device: torch.device) -> tuple[float, float, Any]:
    """(wall seconds, process CPU seconds, result)."""
    _sync(device)
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    _sync(device)
    return time.perf_counter() - t, time.process_time() - c, out


def measure(model, name: str, cfg: str, batch: int, new_tokens: int, prompt_tokens: int,
            repeats: int, seed: int, backend: str) -> dict[str, Any]:
    """One row: replay and ``generate()`` tokens per second for ``cfg`` at ``batch``."""
    device = next(model.parameters()).device
    ids = _prompts(int(model.config.vocab_size), batch, prompt_tokens, seed).to(device)
    prompts = ids.tolist()
    decoder = ReplayDecoder(model, cfg, seed=seed, backend=backend)
    def hf():
        return _hf_generate(model, ids, new_tokens)

    def rp():
        return _replay_generate(decoder, prompts, new_tokens)

    warm = min(4, new_tokens)
    _hf_generate(model, ids, warm)
    _replay_generate(decoder, prompts, warm)
    t_hf, t_rp, c_hf, c_rp = [], [], [], []
    for _ in range(repeats):
        dt, dc, ref = _timed(hf, device)
        t_hf.append(dt)
        c_hf.append(dc)
        dt, dc, got = _timed(rp, device)
        t_rp.append(dt)
        c_rp.append(dc)
    hf_s, rp_s = min(t_hf), min(t_rp)
    tokens = batch * new_tokens
    on_cpu = device.type == "cpu"  # a GPU run's CPU time is launch overhead, not the work
    return {
        "model": name, "config": parse_config(cfg).label, "batch": batch,
        "new_tokens": new_tokens, "prompt_tokens": prompt_tokens,
        "replay_tok_s": round(tokens / rp_s, 1), "generate_tok_s": round(tokens / hf_s, 1),
        "slowdown": round(rp_s / hf_s, 3),
        "cpu_slowdown": round(min(c_rp) / min(c_hf), 3) if on_cpu else None,
        "match": round(float((ref.cpu() == got).float().mean()), 4),
        "replay_s": [round(t, 4) for t in t_rp], "generate_s": [round(t, 4) for t in t_hf],
        "replay_cpu_s": [round(t, 4) for t in c_rp] if on_cpu else None,
        "generate_cpu_s": [round(t, 4) for t in c_hf] if on_cpu else None,
        "kernels": "triton" if decoder.use_kernels else "reference",
    }


def markdown(rows: list[dict], header: str) -> str:
    cpu = any(r.get("cpu_slowdown") is not None for r in rows)
    lines = [header, "", "| model | config | batch | new tokens | replay tok/s | generate() tok/s "
             "| slowdown | " + ("cpu slowdown | " if cpu else "") + "match | kernels |",
             "|" + "---|" * (10 if cpu else 9)]
    for r in rows:
        c = f"{r['cpu_slowdown']:.2f} | " if cpu else ""
        lines.append(f"| {r['model']} | {r['config']} | {r['batch']} | {r['new_tokens']} | "
                     f"{r['replay_tok_s']:.1f} | {r['generate_tok_s']:.1f} | {r['slowdown']:.2f} | "
                     f"{c}{r['match']:.3f} | {r['kernels']} |")
    return "\n".join(lines) + "\n"


def _machine(device: torch.device, threads: int) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    return (f"CPU ({platform.processor() or platform.machine()}), {threads} torch threads of "
            f"{os.cpu_count()} cores, torch {torch.__version__}")


def _ints(text: str, what: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--{what} takes comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise ValueError(f"--{what} values must be >= 1, got {text!r}")
    return vals


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.generation",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="nemotron-h-tiny,qwen3.5-tiny",
                   help="comma-separated: fixture names, random:<model_type>, "
                        "random:qwen3.5-4b, random:nemotron-3-nano-4b")
    p.add_argument("--configs", default=DEFAULT_CONFIGS,
                   help=f"precision configs (presets or config strings; default {DEFAULT_CONFIGS})")
    p.add_argument("--batch", default="1,8,32", help="comma-separated batch sizes")
    p.add_argument("--new-tokens", type=int, default=64, help="generated tokens per row")
    p.add_argument("--prompt-tokens", type=int, default=64, help="prompt length in tokens")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per side (the fastest counts)")
    p.add_argument("--layers", type=int, default=None,
                   help="layers of the random 4B-shaped models (default: up to the first "
                        "attention layer)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=sorted(_DTYPES), default=None,
                   help="model dtype (default: bfloat16 on CUDA, float32 on the CPU)")
    p.add_argument("--kernels", choices=("auto", "reference", "triton"), default="auto",
                   help="decoder backend (auto: Triton on CUDA, the reference elsewhere)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("generation-bench"), help="output folder")
    args = p.parse_args(argv)
    try:
        args.batches = _ints(args.batch, "batch")
    except ValueError as exc:
        p.error(str(exc))
    for what in ("new_tokens", "prompt_tokens", "repeats"):
        if getattr(args, what) < 1:
            p.error(f"--{what.replace('_', '-')} must be >= 1")
    args.config_list = split_configs([args.configs])
    for c in args.config_list:
        try:
            parse_config(c)
        except ValueError as exc:
            p.error(f"--configs: {exc}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = _DTYPES[args.dtype or ("bfloat16" if device.type == "cuda" else "float32")]
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python -m benchmarks.generation " + " ".join(sys.argv[1:] if argv is None else argv)
    machine = _machine(device, torch.get_num_threads())
    header = f"`{command}`\n\n{machine}; dtype {str(dtype).removeprefix('torch.')}"
    rows: list[dict] = []
    for name in (m.strip() for m in args.models.split(",") if m.strip()):
        model = _load(name, args.layers, args.device, dtype)
        for batch in args.batches:
            for cfg in args.config_list:
                row = measure(model, name, cfg, batch, args.new_tokens, args.prompt_tokens,
                              args.repeats, args.seed, args.kernels)
                rows.append(row)
                print(" | ".join(str(row[c]) for c in COLUMNS), flush=True)
                payload = {"command": command, "machine": machine, "dtype": str(dtype),
                           "rows": rows}
                write_rows(args.out, "generation", rows, payload, markdown(rows, header))
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(markdown(rows, header))
    return 0


if __name__ == "__main__":
    sys.exit(main())
