"""``replayssm-quant eval``: GPQA-Diamond / MMLU-Pro / MATH Level 5 under precision configs,
paired against the FP32 reference."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import (
    MofNCompleteColumn,
    Progress,
    TimeElapsedColumn,
)
from rich.table import Table

from ..precision import split_configs
from ..results.budget import Budget
from .console import fitted_columns, print_table
from .errors import BadInput, check_in_path, check_out_dir, fail

DEFAULT_TASKS = "gpqa_diamond,mmlu_pro,math_l5"
DEFAULT_CONFIGS = "fp32,nvfp4-read/fp32,nvfp4-read/fp8-sr,shared-nvfp4"
HOW_TO_READ = ("How to read it: Δ is the config's accuracy minus the reference's on the same items "
               "(negative: a drop); a Δ 95% CI that spans 0 with a high McNemar p shows no "
               "detectable difference; flips are items answered differently; trunc % hit "
               "--max-gen-toks.")


def _pct(x: Any) -> str:
    return "–" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{100 * x:.1f}"


def _p(x: Any) -> str:
    return "–" if x is None else f"{x:.3g}"


class _Progress:
    """Rich progress on a terminal (one bar over the (task, config) runs, one over the current
    run's requests), started with the first run so an early error prints alone; without a
    terminal (``progress`` None) only the line per finished run."""

    def __init__(self, progress: Progress | None, console: Console, total: int) -> None:
        self.progress = progress
        self.console = console
        self.total = total
        self.runs = None
        self.reqs = None

    def _start(self) -> bool:
        if self.progress is None:
            return False
        if self.runs is None:
            self.progress.start()
            self.runs = self.progress.add_task("runs", total=self.total)
        return True

    def stop(self) -> None:
        if self.progress is not None and self.progress.live.is_started:
            self.progress.stop()

    def run_started(self, task: str, config: str, index: int, total: int) -> None:
        if not self._start():
            return
        self.progress.update(self.runs, total=total, completed=index - 1,
                             description=f"{task} × {config}")
        if self.reqs is not None:
            self.progress.remove_task(self.reqs)
        self.reqs = self.progress.add_task(f"  {task} × {config}: generations", total=None)

    def requests(self, done: int, total: int) -> None:
        if self.reqs is not None:
            self.progress.update(self.reqs, total=total, completed=done)

    def run_finished(self, task: str, config: str, summary: dict[str, Any], cached: bool,
                     seconds: float) -> None:
        if self._start():
            self.progress.advance(self.runs)
        how = "cached" if cached else f"{seconds:.0f} s"
        self.console.print(
            f"{task} × {config}: n={summary.get('n')} accuracy {_pct(summary.get('accuracy'))}% "
            f"(lm-eval {_pct(summary.get('accuracy_raw'))}%), truncated "
            f"{_pct(summary.get('truncation_rate'))}%, invalid "
            f"{_pct(summary.get('invalid_rate'))}% [{how}]", markup=False, highlight=False,
            soft_wrap=True)


def _print_summary(console: Console, summary: dict[str, Any]) -> None:
    t = Table(title=f"{summary['model']}: accuracy vs {summary['reference']} (paired: same "
              "items, prompts and seeds)", title_justify="left")
    for col in ("task", "config", "n", "acc %", "95% CI", "Δ pts", "Δ 95% CI", "McNemar p",
                "flips %", "trunc %", "invalid %"):
        t.add_column(col, justify="left" if col in ("task", "config") else "right",
                     no_wrap=True)
    for r in summary["results"]:
        lo, hi, dlo, dhi = (r.get(k) for k in ("accuracy_lo", "accuracy_hi", "delta_lo",
                                               "delta_hi"))
        t.add_row(r["task"], r.get("name") or r["config"], str(r["n"]), _pct(r.get("accuracy")),
                  "–" if lo is None else f"{_pct(lo)}–{_pct(hi)}",
                  "–" if r.get("delta") is None else f"{100 * r['delta']:+.1f}",
                  "–" if dlo is None else f"{100 * dlo:+.1f}…{100 * dhi:+.1f}",
                  _p(r.get("mcnemar_p")), _pct(r.get("flip_rate")),
                  _pct(r.get("truncation_rate")), _pct(r.get("invalid_rate")))
    print_table(console, t, HOW_TO_READ)


def _quiet() -> None:
    """lm-eval warns on every run that gen_kwargs override the YAML (that is the point here),
    and datasets draws a progress bar per split and filter: keep the console to our progress."""
    import logging

    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    try:
        import datasets

        datasets.disable_progress_bars()
    except ImportError:
        pass


def _probe_options(model: str, specs: list[Any], context_lengths: str,
                   ruler_subtasks: str | None, carry_terms: int, carry_rule: str = "table"
                   ) -> tuple[tuple[int, ...], tuple[str, ...] | None]:
    """Checked ``--context-lengths`` and ``--ruler-subtasks`` (a ``ValueError`` per bad one)."""
    from ..evals.ruler import (
        check_context_lengths,
        parse_context_lengths,
        plan,
        resolve_subtasks,
        tokenizer_source,
    )

    lengths = parse_context_lengths(context_lengths)
    subtasks = resolve_subtasks(ruler_subtasks) if ruler_subtasks else None
    if carry_terms < 2:
        raise ValueError("--carry-terms must be >= 2")
    from ..evals.carry_chain import RULES

    if carry_rule not in RULES:
        raise ValueError(f"--carry-rule must be one of {', '.join(RULES)}, got {carry_rule!r}")
    if any(s.key == "ruler" for s in specs):
        tokenizer_source(model)
        check_context_lengths(model, lengths)
        plan(resolve_subtasks(subtasks), lengths)
    return lengths, subtasks


def _check_inputs(model: str, specs: list[Any], data: Path | None, out: Path) -> None:
    """Output folder, model and data checked in a second or two, before lm-eval starts."""
    from ..evals.generated import is_generated
    from ..models.fixture import FIXTURES, probe_trained
    from ..models.loading import check_model, hub_offline, hub_reachable

    check_out_dir(out)
    check_model(model)
    probes = [s.key for s in specs if is_generated(s)]
    if probes and model in FIXTURES and not probe_trained(model):
        trained = [f for f in FIXTURES if probe_trained(f)]
        raise BadInput(f"fixture {model} has no probe training, so it scores 0 on "
                       f"{', '.join(probes)} under every config; use "
                       f"{' or '.join(trained) or 'a probe-trained model'}, or train it with "
                       "tools/train_probes.py")
    needs_data = [s.key for s in specs if not is_generated(s)]
    if data is not None:
        check_in_path(data, "--data", folder=True)
        if needs_data and not any(p.is_file() for p in data.rglob("*")):
            raise BadInput(f"--data {data} is empty; it needs the task files of "
                           f"{', '.join(needs_data)} (python tools/make_task_data.py {data} "
                           "writes a small set)")
    elif needs_data and not hub_offline() and not hub_reachable(timeout=1.5):
        raise BadInput(f"the Hugging Face hub cannot be contacted (offline?) to fetch "
                       f"{', '.join(needs_data)}; pass --data FOLDER with local task data "
                       "(python tools/make_task_data.py FOLDER writes a small set), or set "
                       "HF_DATASETS_OFFLINE=1 to use the datasets cache")


def _sequential_plan(on: bool, cap: int | float | None, round_size: int,
                     budget_points: float, alpha: float) -> Any:
    """The checked ``--until-decided`` plan (None without the flag)."""
    if not on:
        return None
    from ..evals.until_decided import SequentialPlan

    if cap is None or cap < 1:
        raise ValueError("--until-decided needs --limit N (items per subtask at most, an "
                         "integer)")
    return SequentialPlan(round_size=round_size, cap=int(cap), budget_points=budget_points,
                          alpha=alpha)


def _decision_line(task: str, config: str, d: Any, budget_points: float) -> str:
    bounds = ("–" if not math.isfinite(d.lo) else
              f"{100 * d.lo:+.1f}…{100 * d.hi:+.1f}")
    delta = "–" if not math.isfinite(d.delta) else f"{100 * d.delta:+.1f}"
    return (f"{task} × {config}: {d.verdict} at n={d.n} items (Δ {delta} pts, confidence "
            f"sequence {bounds} pts; budget -{budget_points:g})")


def _run_until_decided(settings: Any, out: Path, plan: Any, resamples: int, tracker: Any,
                       console: Console) -> None:
    from ..evals.tasks import TaskDataError
    from ..evals.until_decided import FILE, run_until_decided

    def announce(task: str, config: str, d: Any) -> None:
        console.print(_decision_line(task, config, d, plan.budget_points), markup=False,
                      highlight=False, soft_wrap=True)

    try:
        result = run_until_decided(settings, out, plan, progress=tracker, resamples=resamples,
                                   on_decision=announce)
    except (TaskDataError, ValueError, OSError) as e:
        raise fail(e) from None
    finally:
        tracker.stop()
    _print_summary(Console(), result.summary)
    g = result.generations
    console.print(f"generations: {g['used']} used, {g['fixed_n']} for the fixed-n run "
                  f"({100 * g['saved']:.0f}% saved)")
    console.print(f"wrote {out}/summary.json, {out}/items.parquet, {out}/{FILE} and runs/")


def _device_map_text(spec: str) -> str:
    """A checked ``--device-map`` as the device string the model loader takes
    (``load_model`` reads a strategy name or JSON object there as a device map)."""
    import json

    from ..models.loading import parse_device_map

    dmap = parse_device_map(spec)
    if isinstance(dmap, dict):
        return json.dumps(dmap)
    return "balanced" if dmap == "auto" else dmap


def register(app: typer.Typer) -> None:
    @app.command("eval")
    def eval_(
        model: Annotated[str, typer.Argument(
            help="A bundled fixture (nemotron-h-tiny, qwen3.5-tiny), a Hugging Face hub id or "
                 "local folder of a NemotronH / Qwen3.5 / Qwen3-Next model, or "
                 "random:<model_type>.")],
        tasks: Annotated[str, typer.Option(
            help="Comma-separated: gpqa_diamond, mmlu_pro, math_l5, and the generated probes "
                 "ruler (lm-eval's RULER at --context-lengths) and carry_chain (a table walk "
                 "of 1,000+ generated tokens in MATH's answer format; docs/probes.md).")] = DEFAULT_TASKS,
        configs: Annotated[list[str] | None, typer.Option(
            "--configs", "-c",
            help="Precision configs (presets or 'ckpt=..,read=..,L=..'), comma-separated or "
                 "repeated; fp32 (the reference) is always run.")] = None,
        data: Annotated[Path | None, typer.Option(
            help="Folder of local task data in the hub's schemas (gpqa_diamond.csv|jsonl, "
                 "mmlu_pro/{test,validation}*.parquet, math/test.jsonl ...); default: the "
                 "Hugging Face hub.")] = None,
        limit: Annotated[float | None, typer.Option(
            help="Items per lm-eval task (groups: per subject); < 1 is a fraction. ruler: items "
                 "generated per subtask and context length (default 500); carry_chain: "
                 "problems generated (default 100).")] = None,
        max_gen_toks: Annotated[int, typer.Option(
            help="Generation limit for every task; answers that hit it are counted as "
                 "truncated.")] = 32768,
        out: Annotated[Path, typer.Option(help="Output folder (resumable).")] = Path("eval-out"),
        seed: Annotated[int, typer.Option(
            help="Seeds Python's random before each task (GPQA choice order), the few-shot "
                 "sampler and the stochastic-rounding stream.")] = 0,
        backend: Annotated[str, typer.Option(
            help="hf: ReplaySSM decode of the Hugging Face model (reference on CPU, Triton "
                 "kernels on CUDA); vllm: lm-eval's vLLM backend with the ReplaySSM "
                 "plugin.")] = "hf",
        device: Annotated[str, typer.Option(help="hf backend device.")] = "cpu",
        device_map: Annotated[str | None, typer.Option(
            "--device-map",
            help="hf backend: spread the model's layers over several GPUs: auto or balanced, "
                 "sequential, or a JSON object / .json file of module name -> device (every "
                 "SSM layer decodes on its own GPU). Replaces --device; for vllm use "
                 "--tensor-parallel-size. docs/multi-gpu.md.")] = None,
        dtype: Annotated[str, typer.Option(
            help="Compute dtype: float32, bfloat16, float16 (vllm: also auto).")] = "float32",
        batch_size: Annotated[int, typer.Option(help="Sequences decoded together.")] = 8,
        tensor_parallel_size: Annotated[int, typer.Option(
            help="vllm backend: GPUs one copy of the model is split over (for a model that "
                 "does not fit one GPU).")] = 1,
        data_parallel_size: Annotated[int, typer.Option(
            help="vllm backend: copies of the model, each on its own GPU(s), sharing the "
                 "requests (needs ray).")] = 1,
        resamples: Annotated[int, typer.Option(help="Bootstrap resamples.")] = 10_000,
        context_lengths: Annotated[str, typer.Option(
            help="ruler: comma-separated context lengths in tokens of the model's tokenizer "
                 "(lm-eval's max_seq_lengths metadata); results per subtask and length.")
        ] = "2048,4096",
        ruler_subtasks: Annotated[str | None, typer.Option(
            help="ruler: comma-separated subtasks. Offline (synthetic haystacks, the default): "
                 "niah_single_1, niah_multikey_2, niah_multikey_3, vt (vt needs lengths >= "
                 "1024). Need the hub (Paul Graham essay haystack and nltk punkt_tab): "
                 "niah_single_2, niah_single_3, niah_multikey_1, niah_multivalue, "
                 "niah_multiquery.")] = None,
        carry_terms: Annotated[int, typer.Option(
            help="carry_chain difficulty: steps of the table walk (48: ~1,500-token "
                 "solutions).")] = 48,
        carry_rule: Annotated[str, typer.Option(
            help="carry_chain step rule: 'table' (a random ten-cycle given as a table in the "
                 "prompt; each step is a lookup) or 'shift' (f(x) = x + s mod 10; nothing to "
                 "look up, so a model with windowed attention carries every step in its SSM "
                 "state).")] = "table",
        until_decided: Annotated[bool, typer.Option(
            "--until-decided",
            help="Add items in rounds of --round per subtask and stop each config once its "
                 "paired accuracy difference from fp32 is decided against --budget-points "
                 "(anytime-valid betting confidence sequence; docs/probes.md); --limit is the "
                 "cap. Writes sequential.json beside summary.json.")] = False,
        round_size: Annotated[int, typer.Option(
            "--round", help="--until-decided: items added per subtask per round.")] = 20,
        budget_points: Annotated[float, typer.Option(
            help="--until-decided: the accuracy drop allowed, in points (the recommender's "
                 "max_accuracy_drop).")] = Budget.max_accuracy_drop,
        alpha: Annotated[float, typer.Option(
            help="--until-decided: error rate of the decisions, in (0, 1).")] = 0.05,
    ) -> None:
        """Run the task suite under each config and compare every config with the FP32
        reference on identical items: accuracy with CI, the paired difference with Tango's
        score interval (valid at small n), McNemar p, flip, truncation and invalid-answer
        rates. Exit 2 on bad input."""
        from ..evals.suite import SuiteSettings, run_suite
        from ..evals.tasks import TaskDataError, resolve_tasks
        from ..precision import PRESETS, parse_config

        console = Console(stderr=True)
        try:
            specs = resolve_tasks(tasks)
            lengths, subtasks = _probe_options(model, specs, context_lengths, ruler_subtasks,
                                               carry_terms, carry_rule)
            cfg_list = split_configs(configs or [DEFAULT_CONFIGS])
            cfgs = [parse_config(c) for c in cfg_list]
            if backend not in ("hf", "vllm"):
                raise ValueError(f"--backend must be hf or vllm, got {backend!r}")
            if backend == "vllm":
                from ..evals.lm_backend import vllm_available

                if not vllm_available():
                    raise ValueError("--backend vllm needs vLLM, which is not installed "
                                     "(pip install 'replayssm-quant[vllm]')")
            if tensor_parallel_size < 1 or data_parallel_size < 1:
                raise ValueError("--tensor-parallel-size and --data-parallel-size must be >= 1")
            if backend != "vllm" and (tensor_parallel_size, data_parallel_size) != (1, 1):
                raise ValueError("--tensor-parallel-size and --data-parallel-size need "
                                 "--backend vllm")
            placement = device
            if device_map is not None:
                if backend != "hf":
                    raise ValueError("--device-map needs --backend hf (vllm: "
                                     "--tensor-parallel-size)")
                placement = _device_map_text(device_map)
            if dtype not in ("float32", "bfloat16", "float16", "auto") or (
                    dtype == "auto" and backend == "hf"):
                raise ValueError(f"unsupported --dtype {dtype!r}")
            if max_gen_toks < 1:
                raise ValueError("--max-gen-toks must be >= 1")
            lim: int | float | None = limit
            if limit is not None:
                if limit <= 0:
                    raise ValueError("--limit must be > 0")
                lim = int(limit) if limit >= 1 else float(limit)
            plan = _sequential_plan(until_decided, lim, round_size, budget_points, alpha)
        except ValueError as e:
            raise fail(e) from None
        _check_inputs(model, specs, data, out)
        if data is not None:
            os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
        settings = SuiteSettings(
            model=model, tasks=tuple(s.key for s in specs), configs=tuple(cfg_list), limit=lim,
            max_gen_toks=max_gen_toks, seed=seed, data=str(data.resolve()) if data else None,
            backend=backend, dtype=dtype, device=placement, batch_size=batch_size,
            context_lengths=lengths, ruler_subtasks=subtasks, carry_terms=carry_terms,
            carry_rule=carry_rule,
            tensor_parallel_size=tensor_parallel_size, data_parallel_size=data_parallel_size)
        _quiet()
        columns = (*fitted_columns(console.width, 24), MofNCompleteColumn(),
                   TimeElapsedColumn())
        n_cfg = len({str(c) for c in [PRESETS["fp32"], *cfgs]})
        tracker = _Progress(Progress(*columns, console=console, transient=False)
                            if console.is_terminal else None, console, len(specs) * n_cfg)
        if plan is not None:
            _run_until_decided(settings, out, plan, resamples, tracker, console)
            return
        try:
            result = run_suite(settings, out, resamples=resamples, progress=tracker)
        except (TaskDataError, ValueError, OSError) as e:
            raise fail(e) from None
        finally:
            tracker.stop()
        _print_summary(Console(), result.summary)
        console.print(f"wrote {out}/summary.json, {out}/items.parquet and runs/ "
                      f"({len(result.ran)} run, {len(result.cached)} cached)")
