"""``replayssm-quant drift``: teacher-forced KL drift of precision configs against FP32."""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import (
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TaskProgressColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from ..evals.data import PG19_REPO, PG19_SPLIT
from ..evals.drift import DEFAULT_CONFIGS
from ..precision import parse_config, split_configs
from .console import PlainProgressLines, fitted_columns, print_table, show_warnings
from .errors import BadInput, check_out_dir, fail

DEFAULT_MODELS = ("nemotron-h-tiny", "qwen3.5-tiny")
HOW_TO_READ = ("How to read it: lower KL is better (0: the config's next-token distributions equal "
               "the reference's); same top-1 near 100% and PPL ratio near 1 are better; the fp32 "
               "row checks the emulation itself and should be ~0.")
_DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
           "float16": "float16", "fp16": "float16"}


class _TokensPerSecond(ProgressColumn):
    """Model tokens processed per second so far (reference and configs alike)."""

    def render(self, task) -> Text:
        elapsed = task.finished_time if task.finished else task.elapsed
        speed = task.completed / elapsed if elapsed else None
        return Text(f"{speed:,.0f} tok/s" if speed else "– tok/s", style="progress.data.speed")


class _RichProgress:
    """Adapts a rich progress display to :class:`~replayssm_quant.evals.drift.DriftProgress`;
    the display starts with the first task, so an early error prints nothing but itself."""

    def __init__(self, progress: Progress, label: str) -> None:
        self.progress = progress
        self.label = label
        self.task = None

    def start(self, total_tokens: int) -> None:
        if not self.progress.live.is_started:
            self.progress.start()
        self.task = self.progress.add_task(self.label, total=max(total_tokens, 1))
        if total_tokens == 0:
            self.progress.update(self.task, completed=1, description=f"{self.label} (cached)")

    def advance(self, tokens: int, description: str) -> None:
        self.progress.update(self.task, advance=tokens, description=description)


def _fmt(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    if x == 0:
        return "0"
    return f"{x:.2e}" if abs(x) < 1e-2 or abs(x) >= 1e3 else f"{x:.4f}"


def _print_result(console: Console, result, seconds: float) -> None:
    s = result.summary
    buckets = [b["bucket"] for b in s["buckets"]]
    t = Table(title=f"{s['model']}: mean KL(ref ‖ config) in nats by token position "
              f"({s['positions_per_config']:,} positions after a {s['prefill']}-token prefill, "
              f"data {s['data']})", title_justify="left")
    t.add_column("config", no_wrap=True)
    for b in buckets:
        t.add_column(b, justify="right", no_wrap=True)
    for col in ("all", "95% CI", "p99", "same top-1", "PPL ratio"):
        t.add_column(col, justify="right", no_wrap=True)
    for c in s["configs"]:
        by = {b["bucket"]: b for b in c["buckets"]}
        o = c["overall"]
        st = o.get("same_top1")
        t.add_row(c["name"], *[_fmt(by[b]["kl_mean"]) if b in by else "–" for b in buckets],
                  _fmt(o.get("kl_mean")),
                  f"{_fmt(o.get('kl_ci_lo'))} – {_fmt(o.get('kl_ci_hi'))}",
                  _fmt(o.get("kl_p99")),
                  "–" if st is None else f"{100 * st:.2f}%",
                  "–" if o.get("ppl_ratio") is None else f"{o['ppl_ratio']:.4f}")
    print_table(console, t, HOW_TO_READ)
    sp = s["decay_spectrum"]
    frac = ", ".join(f"{k} {100 * v:.0f}%" for k, v in sp["fraction_of_heads"].items())
    console.print(f"decay spectrum: {sp['heads']} SSM heads; heads with mean per-token decay "
                  f"{frac}; longest-memory head {sp['max_mean_decay']:.4f}", soft_wrap=True)
    if result.out_dir is not None:
        console.print(f"wrote {result.out_dir}/ (drift.md, summary.json, drift.parquet, "
                      f"drift_pooled.parquet, kl_vs_position.png) in {seconds:.1f} s",
                      soft_wrap=True)


def register(app: typer.Typer) -> None:
    @app.command("drift")
    def drift(
        models: Annotated[list[str] | None, typer.Argument(
            metavar="MODEL",
            help="Models: a bundled fixture (nemotron-h-tiny, qwen3.5-tiny), a Hugging Face hub "
                 "id or local folder of a NemotronH / Mamba2 / Qwen3.5 / Qwen3.5-MoE / "
                 "Qwen3-Next model, or random:<model_type> (tiny random weights). "
                 "Default: both fixtures.")] = None,
        configs: Annotated[list[str] | None, typer.Option(
            "--configs", "-c",
            help="Precision configs: preset names or 'ckpt=..,read=..,L=..' strings, separated "
                 "by commas or spaces, or the option repeated; 'all' for every preset. "
                 f"Default: {' '.join(DEFAULT_CONFIGS)}.")] = None,
        data: Annotated[str, typer.Option(
            help="Text: gutenberg (held-out Project Gutenberg plays, offline), "
                 "pg19[:REPO[:SPLIT]] (hub parquet mirror), self:N (N tokens sampled from the "
                 "FP32 model), or a .txt/.parquet/.jsonl file or folder (PG-19 schema).")
        ] = "gutenberg",
        max_tokens: Annotated[int, typer.Option(
            "--max-tokens", help="Tokens per document (documents are cut to this; a shorter "
                                 "one runs on what it holds, with a warning).")] = 2048,
        docs: Annotated[int, typer.Option(help="Number of documents.")] = 1,
        prefill: Annotated[int, typer.Option(
            help="Prompt tokens run by the exact FP32 chunked scan; every later token runs "
                 "the config's decode emulation.")] = 128,
        out: Annotated[Path, typer.Option(
            help="Output folder (one subfolder per model when several are given). A rerun "
                 "with the same folder resumes and skips finished (document, config) "
                 "pairs.")] = Path("replayssm-drift"),
        device: Annotated[str, typer.Option(
            help="auto (CUDA if present), cpu, cuda or cuda:N.")] = "auto",
        device_map: Annotated[str | None, typer.Option(
            "--device-map",
            help="Spread each model's layers over several GPUs (a model too large for one): "
                 "auto or balanced (even split, whole layers per GPU), sequential, or a JSON "
                 "object / .json file of module name -> device, e.g. "
                 "'{\"model.embeddings\": 0, \"model.layers.0\": 0, \"lm_head\": 1}'. "
                 "Replaces --device; docs/multi-gpu.md.")] = None,
        dtype: Annotated[str, typer.Option(
            help="Model compute dtype: auto (float32 on CPU, bfloat16 on CUDA), float32, "
                 "bfloat16, float16. SSM states are emulated per config either way.")] = "auto",
        seed: Annotated[int, typer.Option(
            help="Seed of stochastic rounding and of self:N sampling.")] = 0,
        reference: Annotated[str, typer.Option(
            help="exact: the model's own FP32 forward; fp32: the fp32 preset's decode "
                 "emulation.")] = "exact",
        keep_reference: Annotated[bool, typer.Option(
            "--keep-reference", help="Keep the cached reference hidden states of finished "
                                     "documents.")] = False,
        pg19_repo: Annotated[str, typer.Option(help="Hub repo of the PG-19 parquet mirror.")
                             ] = PG19_REPO,
        pg19_split: Annotated[str, typer.Option(help="Split of the PG-19 mirror.")] = PG19_SPLIT,
        threads: Annotated[int | None, typer.Option(
            help="CPU threads for torch. Default: 1 on a CPU (the emulation is thousands of "
                 "small ops per token, which extra threads only slow down), torch's choice "
                 "on CUDA.")] = None,
        verbose: Annotated[bool, typer.Option(
            "--verbose", help="Show transformers' warnings.")] = False,
        strict: Annotated[bool, typer.Option(
            "--strict", help="Fail, rather than warn, when the data holds fewer tokens or "
                             "documents than asked.")] = False,
    ) -> None:
        """Teacher-forced KL drift: run each document once in FP32 (the reference), then once
        per precision config with every SSM layer emulating that config's decode numerics after
        the prefill, and report KL(ref ‖ config), top-1 agreement and the perplexity ratio per
        token-position bucket.

        Writes drift.md, summary.json, drift.parquet, drift_pooled.parquet and
        kl_vs_position.png. With no arguments: both bundled fixture models on held-out
        Gutenberg text (a few minutes on a CPU).
        """
        import torch

        from ..evals.drift import run_drift
        from ..models.loading import check_model, parse_device_map

        err = Console(stderr=True)
        console = Console()
        if max_tokens < 2:
            raise BadInput(f"--max-tokens must be >= 2 (tokens per document), got {max_tokens}")
        if docs < 1:
            raise BadInput(f"--docs must be >= 1, got {docs}")
        if prefill < 0 or prefill + 2 > max_tokens:
            raise BadInput(f"--prefill must be >= 0 and leave 2 tokens of --max-tokens "
                           f"{max_tokens}, got {prefill}")
        check_out_dir(out)
        names = list(models) if models else list(DEFAULT_MODELS)
        for name in names:
            check_model(name)
        show_warnings()
        if not verbose:
            import transformers

            transformers.logging.set_verbosity_error()
            transformers.logging.disable_progress_bar()
        cfg_list = split_configs(configs) if configs else list(DEFAULT_CONFIGS)
        try:
            dev = _device(device)
            dt = _dtype(dtype, dev)
            dmap = None if device_map is None else parse_device_map(device_map)
        except ValueError as e:
            raise fail(e) from None
        if threads or not dev.startswith("cuda"):
            torch.set_num_threads(threads or 1)
        results = []
        t0 = time.perf_counter()
        wide = err.width >= 110  # the time left only where it fits
        columns = (*fitted_columns(err.width, 58 if wide else 48), TaskProgressColumn(),
                   MofNCompleteColumn(), _TokensPerSecond(), TimeElapsedColumn(),
                   *((TimeRemainingColumn(),) if wide else ()))
        progress = Progress(*columns, console=err, transient=True)
        try:
            cfgs = [parse_config(c) for c in cfg_list]
            for name in names:
                folder = out if len(names) == 1 else out / _slug(name)
                t1 = time.perf_counter()
                r = run_drift(name, cfgs, data, max_tokens=max_tokens, docs=docs,
                              prefill=prefill, seed=seed, out=folder, device=dev, dtype=dt,
                              reference=reference, keep_reference=keep_reference,
                              pg19_repo=pg19_repo, pg19_split=pg19_split, strict=strict,
                              device_map=dmap,
                              progress=(_RichProgress(progress, name) if err.is_terminal
                                        else PlainProgressLines(err, name)))
                results.append((r, time.perf_counter() - t1))
        except ValueError as e:  # configs, options; typed library errors map in user_errors
            raise fail(e) from None
        finally:
            if progress.live.is_started:
                progress.stop()
        for r, seconds in results:
            _print_result(console, r, seconds)
        if len(results) > 1:
            console.print(f"total {time.perf_counter() - t0:.1f} s")


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "model"


def _device(text: str) -> str:
    import torch

    t = text.strip().lower()
    if t == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(t)
    except RuntimeError:
        raise ValueError(f"unknown device {text!r}; use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {text!r} requested but CUDA is not available")
    return str(dev)


def _dtype(text: str, device: str):
    import torch

    t = text.strip().lower()
    if t == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if t not in _DTYPES:
        raise ValueError(f"unknown dtype {text!r}; use auto, {', '.join(sorted(set(_DTYPES)))}")
    return getattr(torch, _DTYPES[t])
