"""Decode-step kernel benchmark (CUDA): time per step for every precision config on the paper
shapes, counted state bytes, achieved bandwidth as a fraction of a device-to-device copy
measured in the same run, and the ratio to our conventional FP32 step.

    python -m benchmarks.decode --out reports/kernels            # full sweep
    python -m benchmarks.decode --batch 256 --L 16                # one batch, one L
    python -m benchmarks.decode --L 8 16 32 64 --window-only      # the window length per shape
    TRITON_INTERPRET=1 python -m benchmarks.decode --device cpu --tiny --L 2 4 --window-only \
        --batch 1 --verify-T 0 --reps 1                           # a dry run without a GPU
    python -m benchmarks.decode targets A.json B.json --out targets.md   # the speed targets

Each measurement replays a CUDA graph: whole windows of L steps, 16 steps to a graph (two
windows at L = 8; window average), the window's flush step from every cursor at L-1 (4
copies to a graph, each after a cursor reset whose time is taken off: ``time_flush``), and
the window's L-1 non-flush steps from every cursor at 0 (as many copies to a graph as the
window graph has windows, the reset again taken off: ``time_nonflush``; the rows also
carry the average derived from the other two as ``nonflush_derived_us``, as older sweeps
gave it). Configs without a window
(conventional steps, FLA's peer kernel) are timed 16 steps to a graph as well, so every
config holds the same share of a graph's start. Each timed replay, and each timed copy, waits
on the GPU behind a spin kernel (``--hold-us``, 100 us) while the host queues it, so the time
is the GPU's alone, and every graph is warmed for 30 replays and 20 ms before timing
(``benchmarks.harness`` says why). Inputs are fresh random values (never zeros) and differ
per step of the window.

One layer's state stays in the GPU's L2 at small batches (4 MiB for Nemotron-3-Super at batch
1, against 50-60 MB of L2), while a served model's dozens of layers take turns and each step
reads its state from HBM. ``--layers auto`` times that case: each step of the graph runs over
enough layers' caches, each its own state and inputs, that the bytes their non-flush steps
read (``working_set``) hold twice the L2, and the time is given per layer. ``--stagger``
spreads the rows' cursors (row i at i mod L) so every step flushes a 1/L share of the rows,
as when requests join at different steps, instead of every row flushing on the same step.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks import harness
from benchmarks.harness import copy_bandwidth, time_graph, write_rows
from benchmarks.targets import evaluate
from benchmarks.targets import main as targets_main
from benchmarks.targets import markdown as targets_markdown
from benchmarks.windows import write_window_table
from replayssm_quant import formats as F
from replayssm_quant.kernels.core.cache import alloc_gdn_cache, alloc_mamba2_cache
from replayssm_quant.kernels.gdn import gdn_decode_step
from replayssm_quant.kernels.mamba2 import mamba2_decode_step
from replayssm_quant.kernels.plan import step_plan
from replayssm_quant.precision import PRESETS, SHAPES, ModelShape, step_bytes


def _fill_state(cache, gen_scale: float = 0.05) -> None:
    """Random fp32 state written through the reference quantizers (ckpt + read copy)."""
    st = cache.ckpt.data
    d = st.shape[-1] * (2 if cache.ckpt.fmt == "nvfp4" else 1)
    S = torch.randn(*st.shape[:-1], d, device=st.device) * gen_scale
    q = F.quantize(S, cache.cfg.ckpt, "rn")
    _copy_q(cache.ckpt, q)
    if cache.read is not None:
        _copy_q(cache.read, F.quantize(F.dequantize(q), cache.cfg.read, "rn"))
    for t in cache.ring.values():
        t.copy_(torch.randn_like(t, dtype=torch.float32).abs().mul_(0.01).to(t.dtype))


def _copy_q(st, q) -> None:
    st.data.copy_(q.data)
    if st.row_scale is not None:
        st.row_scale.copy_(q.row_scale)
    if st.block_scale is not None:
        st.block_scale.copy_(q.block_scale)


class Workload:
    """A layer's cache plus L steps of fresh random inputs for one (shape, batch, config)."""

    def __init__(self, shape: ModelShape, batch: int, cfg, steps: int, spec: int = 0,
                 device: str = "cuda", slots: torch.Tensor | None = None):
        self.shape, self.batch, self.cfg = shape, batch, cfg
        dev = device
        self.slots = torch.arange(batch, dtype=torch.int32, device=dev) if slots is None else slots
        H, P, N, G = shape.heads, shape.head_dim, shape.d_state, shape.groups
        if shape.kind == "mamba2":
            self.cache = alloc_mamba2_cache(cfg, batch, H, P, N, G, spec_tokens=spec,
                                            act_dtype=torch.bfloat16, device=dev, seed=1)
            self.A = -torch.empty(H, device=dev).uniform_(1, 16)
            self.D = torch.randn(H, device=dev)
            self.inputs = [dict(
                x=torch.randn(batch, H, P, device=dev, dtype=torch.bfloat16),
                dt=torch.empty(batch, H, device=dev).uniform_(1e-3, 1e-1),
                Bm=(torch.randn(batch, G, N, device=dev) / N**0.5).to(torch.bfloat16),
                C=(torch.randn(batch, G, N, device=dev) / N**0.5).to(torch.bfloat16),
            ) for _ in range(steps)]
        else:
            self.cache = alloc_gdn_cache(cfg, batch, H, P, N, G, spec_tokens=spec,
                                         act_dtype=torch.bfloat16, device=dev, seed=1)
            nrm = torch.nn.functional.normalize
            self.inputs = [dict(
                q=(nrm(torch.randn(batch, G, N, device=dev), dim=-1) * N**-0.5).to(torch.bfloat16),
                k=nrm(torch.randn(batch, G, N, device=dev), dim=-1).to(torch.bfloat16),
                v=torch.randn(batch, H, P, device=dev, dtype=torch.bfloat16),
                g=torch.log(torch.empty(batch, H, device=dev).uniform_(0.9, 0.9999)),
                beta=torch.rand(batch, H, device=dev),
            ) for _ in range(steps)]
        _fill_state(self.cache)

    def step(self, i: int, advance: bool = True, **kw):
        a = self.inputs[i % len(self.inputs)]
        if self.shape.kind == "mamba2":
            return mamba2_decode_step(self.cache, a["x"], a["dt"], self.A, a["Bm"], a["C"],
                                      self.D, self.slots, advance=advance, **kw)
        return gdn_decode_step(self.cache, a["q"], a["k"], a["v"], a["g"], a["beta"],
                               self.slots, advance=advance, **kw)


TINY_SHAPES = {s.name: s for s in (ModelShape("tiny-m2", "mamba2", 2, 32, 32, 1),
                                    ModelShape("tiny-gdn", "gdn", 2, 32, 32, 1))}  # --tiny dry runs
CONV_STEPS = 16  # steps per timed graph for configs without a window (conventional steps, FLA)
REPEAT = 4  # copies per timed graph of a step that leaves the cache as it found it (flush with
# the cursors set back or held, speculative verify): no launch gap of a lone replay in the time


LAYERS_L2 = 2  # --layers auto: rotate through layers whose working sets hold this many L2s
MAX_LAYERS = 512
LAYERED_CONV_STEPS = 8  # steps per graph of a conventional step over several layers


def cache_bytes(w: Workload) -> int:
    """Bytes a step of ``w`` may touch: its cache (checkpoint, read copy, scales, ring, cursor)
    and one step's inputs."""
    ts = list(w.cache.tensors().values())
    ts += [t for st in (w.cache.ckpt, w.cache.read) if st is not None
           for t in (st.row_scale, st.block_scale) if t is not None]
    ts += list(w.inputs[0].values())
    return sum(t.numel() * t.element_size() for t in ts)


def working_set(w: Workload) -> int:
    """Bytes of ``w`` that its non-flush steps read again and again: the counted bytes of a
    non-flush step (the read copy or checkpoint, the ring), at most the whole cache (a
    conventional step reads and writes the same state)."""
    return int(min(cache_bytes(w), step_bytes(w.cfg, w.shape).nonflush * w.batch))


def layer_count(layers: int | str, w: Workload, l2_bytes: int | None = None) -> int:
    """How many layers' caches a measurement rotates through. ``"auto"``: enough that their
    working sets (``working_set``) hold ``LAYERS_L2`` times the GPU's L2, so every step, a
    non-flush step of a narrow read copy too, reads its state from HBM, as a served model's
    steps do when dozens of layers and their weights take turns (1 without a GPU, at most
    ``MAX_LAYERS``)."""
    if layers != "auto":
        n = int(layers)
        if n < 1:
            raise ValueError(f"layers must be a positive count or 'auto', not {layers!r}")
        return n
    if l2_bytes is None:
        l2_bytes = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size \
            if torch.cuda.is_available() else 0
    if not l2_bytes:
        return 1
    return max(1, min(MAX_LAYERS, -(-LAYERS_L2 * l2_bytes // working_set(w))))


def workloads(shape: ModelShape, batch: int, cfg, steps: int, layers: int | str = 1,
              device: str = "cuda", **kw) -> list[Workload]:
    """The caches of ``layer_count(layers)`` layers, each with its own random state and
    inputs (``kw``: ``Workload``'s ``spec``). The layers share one slots tensor, as a
    served model's layers share the step's state indices (vLLM's metadata builder makes one
    per step), so only the first layer's step fetches it from HBM."""
    first = Workload(shape, batch, cfg, steps=steps, device=device, **kw)
    n = layer_count(layers, first)
    return [first] + [Workload(shape, batch, cfg, steps=steps, device=device, slots=first.slots,
                               **kw) for _ in range(n - 1)]


def stagger_cursors(w: Workload) -> None:
    """Row i at cursor i mod L: each step flushes a 1/L share of the rows, as in steady
    serving where requests join at different steps."""
    c = w.cache.cursor
    c.copy_(torch.arange(c.numel(), device=c.device, dtype=c.dtype) % w.cfg.L)


def measure(shape: ModelShape, batch: int, cfg, reps: int, device: str = "cuda",
            layers: int | str = 1, stagger: bool = False, window_only: bool = False,
            **kw) -> dict:
    """Window, non-flush (``time_nonflush``; ``nonflush_derived_us``: from the window and the
    flush, as older sweeps gave it) and flush microseconds per step of one
    layer (``window_only``: the window average alone, NaN for the other two, a fifth of the
    graphs for a sweep over window lengths). With ``layers`` > 1 a
    graph runs each step over every layer in turn (``layer_count``), as a model does, and the
    time is per layer; the graphs then hold one window (8 conventional steps, one flush
    each). With ``stagger`` the rows' cursors are spread (``stagger_cursors``):
    every step of the window then flushes some rows, and only the window average is formed."""
    L = cfg.L
    windows = max(1, CONV_STEPS // L)  # whole windows, as many steps per graph as the
    # conventional step's: a replay's launch gap then weighs the same in every config
    ws = workloads(shape, batch, cfg, max(L * windows, CONV_STEPS), layers, device)
    n = len(ws)
    if n > 1:  # the layers' launches fill the graph: one window (8 conventional steps) will do
        windows = 1
    conv_steps, repeat = (CONV_STEPS, REPEAT) if n == 1 else (LAYERED_CONV_STEPS, 1)

    def steps(count: int, first: int = 0, **kw2):
        for i in range(first, first + count):
            for w in ws:
                w.step(i, **kw, **kw2)

    if L == 1:  # as many steps per graph as a window, so launch costs weigh the same
        t = time_graph(lambda: steps(conv_steps), reps) / (conv_steps * n)
        return dict(window_us=t * 1e6, nonflush_us=t * 1e6, flush_us=t * 1e6, layers=n)
    for w in ws:
        if stagger:
            stagger_cursors(w)
        else:
            w.cache.cursor.zero_()
    t_win = time_graph(lambda: steps(L * windows), reps) / (L * windows * n)
    if stagger or window_only:
        nan = float("nan")
        return dict(window_us=t_win * 1e6, nonflush_us=nan, flush_us=nan, layers=n)
    t_fl = time_flush(ws, reps, repeat, **kw)
    t_nf = time_nonflush(ws, reps, windows, **kw)
    t_nf_derived = (t_win * L - t_fl) / (L - 1)
    return dict(window_us=t_win * 1e6, nonflush_us=t_nf * 1e6, flush_us=t_fl * 1e6,
                nonflush_derived_us=t_nf_derived * 1e6, layers=n)


def time_nonflush(ws: list[Workload], reps: int, repeat: int = 1, **kw) -> float:
    """Seconds of one non-flush step per layer of ``ws``, the average over a window's L-1
    non-flush steps: each call sets every cursor back to 0 and runs steps 0..L-2, as a
    window does before its flush, so the ring records they read grow from 0 to L-2; the
    reset, timed alone the same way, is taken off. Timed directly rather than derived from
    the window and the flush, (window x L - flush) / (L - 1), which moves with every change
    of the flush timed alone (the NVFP4 non-flush ratios moved 3-10% that way with no
    non-flush kernel changed)."""
    L = ws[0].cfg.L

    def reset():
        for w in ws:
            w.cache.cursor.zero_()

    def nonflush():
        reset()
        for i in range(L - 1):
            for w in ws:
                w.step(i, **kw)

    reset()
    t = time_graph(nonflush, reps, repeat=repeat) - time_graph(reset, reps, repeat=repeat)
    return t / ((L - 1) * len(ws))


def time_flush(ws: list[Workload], reps: int, repeat: int = REPEAT, advance: bool = True,
               **kw) -> float:
    """Seconds of one flush step (every row's cursor at L-1) per layer of ``ws``. With
    ``advance`` (default) it is the step a window runs, whose flush launch also moves every
    cursor on: each replay first sets the cursors back to L-1, and that reset, timed alone
    the same way, is taken off. Without it the step leaves the cursors where they are, and
    its flush kernel is compiled without the cursor loop (``ADVANCE`` off), which ptxas can
    give other registers: Mamba-2's nvfp4-read/fp32 flush on 16-row one-warp tiles takes 255
    (8 programs per SM) that way against 168 (12) in the window, as launched on the H200."""
    L = ws[0].cfg.L

    def reset():
        for w in ws:
            w.cache.cursor.fill_(L - 1)

    def flush():
        if advance:
            reset()
        for w in ws:
            w.step(L - 1, advance=advance, **kw)

    reset()
    t = time_graph(flush, reps, repeat=repeat)
    if advance:
        t -= time_graph(reset, reps, repeat=repeat)
    return t / len(ws)


def measure_flush(shape: ModelShape, batch: int, cfg, reps: int, device: str = "cuda",
                  advance: bool = True, **kw) -> float:
    """Microseconds of one flush step (every row's cursor at L-1; ``advance`` as in
    ``time_flush``: by default the window's flush)."""
    w = Workload(shape, batch, cfg, steps=cfg.L, device=device)
    return time_flush([w], reps, REPEAT, advance=advance, **kw) * 1e6


def verify_workload(shape: ModelShape, batch: int, cfg, T: int, device: str = "cuda") -> Workload:
    """A workload for the speculative verify: ring room for T drafts, row i at cursor i mod L."""
    w = Workload(shape, batch, cfg, steps=T, spec=T - 1, device=device)
    stagger_cursors(w)
    return w


def measure_verify(shape: ModelShape, batch: int, cfg, T: int, reps: int,
                   device: str = "cuda", layers: int | str = 1, **kw) -> float:
    """Microseconds of one speculative verify of T drafts (per layer, over ``layers`` as in
    ``measure``). Row i has i mod L committed records in front of the drafts, as in steady
    decoding; the drafts are appended to the ring and the cursor does not move, so every
    replay does the same work."""
    from replayssm_quant.kernels.gdn import gdn_verify
    from replayssm_quant.kernels.mamba2 import mamba2_verify

    ws = workloads(shape, batch, cfg, T, layers, device, spec=T - 1)
    calls = []
    for w in ws:
        stagger_cursors(w)
        st = lambda key, w=w: torch.stack([a[key] for a in w.inputs], 1).contiguous()  # noqa: E731
        if shape.kind == "mamba2":
            args = (w.cache, st("x"), st("dt"), w.A, st("Bm"), st("C"), w.D, w.slots)
            calls.append(lambda args=args: mamba2_verify(*args, **kw))
        else:
            args = (w.cache, st("q"), st("k"), st("v"), st("g"), st("beta"), w.slots)
            calls.append(lambda args=args: gdn_verify(*args, **kw))

    def fn():
        for c in calls:
            c()

    repeat = REPEAT if len(ws) == 1 else 1
    return time_graph(fn, reps, repeat=repeat) / len(ws) * 1e6


def measure_fla(shape: ModelShape, batch: int, reps: int, layers: int | str = 1) -> float | None:
    """FLA's fused recurrent GDN decode (one token, FP32 state in vLLM's (V, K) layout), per
    layer over ``layers`` states in turn: a count, or ``"auto"`` for as many as our
    conventional FP32 step of the same state takes (``layer_count``)."""
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    except Exception:  # noqa: BLE001 - a peer that is not installed is skipped
        return None
    if layers == "auto":
        layers = layer_count(layers, Workload(shape, batch, PRESETS["fp32"], steps=1))
    steps_per_layer = CONV_STEPS if layers == 1 else LAYERED_CONV_STEPS
    H, V, K, G = shape.heads, shape.head_dim, shape.d_state, shape.groups
    dev = "cuda"
    nrm = torch.nn.functional.normalize
    q = nrm(torch.randn(batch, 1, G, K, device=dev), dim=-1).to(torch.bfloat16)
    k = nrm(torch.randn(batch, 1, G, K, device=dev), dim=-1).to(torch.bfloat16)
    v = torch.randn(batch, 1, H, V, device=dev, dtype=torch.bfloat16)
    g = torch.log(torch.empty(batch, 1, H, device=dev).uniform_(0.9, 0.9999))
    beta = torch.rand(batch, 1, H, device=dev).to(torch.bfloat16)
    h0s = [torch.randn(batch, H, V, K, device=dev) * 0.05 for _ in range(layers)]

    def steps():
        for _ in range(steps_per_layer):
            for h0 in h0s:
                fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta, scale=K**-0.5,
                                                 initial_state=h0, output_final_state=True,
                                                 state_v_first=True)

    return time_graph(steps, reps) / (steps_per_layer * layers) * 1e6


VERIFY_CONFIGS = ("replay-fp32", "nvfp4-read/fp16-sr")  # speculative verify rows (L = 16)


COMPILE_BATCHES = (1, 64)  # the launch sets and tiles of small and serving batches


def compile_job(job: tuple) -> tuple:
    """Worker: compile one (shape, config, launch knobs[, batches]) by running a window of
    steps at each batch of ``batches`` (default ``COMPILE_BATCHES``: batch 1 and 64, one
    launch per step with batch-1 tiles, and the separate launches with serving tiles), and a
    verify of T drafts when T > 0, so Triton's on-disk cache serves the main process;
    ``kw = {"verify": knobs}`` compiles only a verify with those knobs)."""
    sname, cfg, kw, T, device, *rest = job
    batches = rest[0] if rest else COMPILE_BATCHES
    t = time.time()
    try:
        shape = SHAPES[sname]
        if "verify" in kw:  # verify launch knobs only
            measure_verify(shape, 2, cfg, T, 1, device=device, **kw["verify"])
        else:
            for batch in batches:
                w = Workload(shape, batch, cfg, steps=max(cfg.L, 2), device=device)
                for i in range(max(cfg.L, 1)):
                    w.step(i, **kw)
                del w
            if T:
                measure_verify(shape, 2, cfg, T, 1, device=device)
        if device == "cuda":
            torch.cuda.synchronize()
        return job, time.time() - t, None
    except Exception as e:  # noqa: BLE001 - reported; the main process compiles it again
        return job, time.time() - t, f"{type(e).__name__}: {e}"[:300]


def compile_batches(batches) -> tuple[int, ...]:
    """The batches to compile a sweep's steps at: ``COMPILE_BATCHES`` and every smaller timed
    batch, whose one-launch tiles batch 1's need not share (batch 4's compiled in the main
    process, one after another, and some took minutes)."""
    return tuple(sorted(set(COMPILE_BATCHES) | {b for b in batches if b < max(COMPILE_BATCHES)}))


def precompile(jobs: list, workers: int, batches=None) -> None:
    """Compile every job's kernels in parallel worker processes, at ``batches`` (default
    ``COMPILE_BATCHES``)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    if batches is not None:
        jobs = [(*j[:5], tuple(batches)) for j in jobs]
    t = time.time()
    if workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as ex:
            results = list(ex.map(compile_job, jobs))
    else:
        results = [compile_job(j) for j in jobs]
    errs = [(j, e) for j, _, e in results if e]
    for j, e in errs:
        print(f"  compile error {j[0]} {j[1].label} {j[2]}: {e}", flush=True)
    print(f"compiled {len(jobs)} variants in {time.time() - t:.0f} s ({workers} workers, "
          f"{len(errs)} errors)", flush=True)


def configs_for(Ls: list[int]) -> list:
    out = []
    for cfg in PRESETS.values():
        if cfg.L == 1:
            out.append(cfg)
            continue
        for L in Ls:
            c = replace(cfg, L=L, name=cfg.name if L == cfg.L else f"{cfg.name}@L{L}")
            out.append(c)
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["targets"]:  # the speed targets over finished sweeps
        return targets_main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="*", default=None,
                    help=f"default: the paper shapes ({', '.join(SHAPES)}); with --tiny "
                         f"{', '.join(TINY_SHAPES)}")
    ap.add_argument("--batch", type=int, nargs="*", default=[256, 1, 64, 512])
    ap.add_argument("--L", type=int, nargs="*", default=[8, 16],
                    help="window lengths: every windowed preset is timed at each; two or more "
                         "also write window_l.json / .csv, one row per (preset, L, batch, shape) "
                         "with the fastest L marked (the sweep: --L 8 16 32 64 --window-only)")
    ap.add_argument("--window-only", action="store_true",
                    help="time each config's window average only (no flush / non-flush graphs): "
                         "a fifth of the graphs, for sweeps over window lengths")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: a dry run of the sweep's plan and files with the kernels under "
                         "TRITON_INTERPRET=1 (with --tiny); its times mean nothing")
    ap.add_argument("--tiny", action="store_true",
                    help=f"the tiny shapes {', '.join(TINY_SHAPES)} instead of the paper shapes")
    ap.add_argument("--configs", nargs="*", default=None, help="preset names (default: all)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--verify-T", type=int, default=8,
                    help="drafts per speculative verify (0: skip the verify rows)")
    ap.add_argument("--workers", type=int, default=min(12, max(1, (os.cpu_count() or 2) - 2)))
    ap.add_argument("--deadline", type=float, default=0,
                    help="seconds after which no new (batch, shape) block starts (0: none)")
    ap.add_argument("--hold-us", type=float, default=harness.HOLD_US,
                    help="GPU hold in microseconds in front of each timed replay, so the host's "
                         "launch latency stays out of the time (0: none)")
    ap.add_argument("--layers", type=_layers_arg, default=1,
                    help="layers whose caches each step runs over in turn, the time given per "
                         "layer; 'auto': enough that they hold twice the GPU's L2, so a small "
                         "batch's state comes from HBM as in a served model (default 1: one "
                         "layer, whose state stays in L2 at small batches)")
    ap.add_argument("--stagger", action="store_true",
                    help="spread the rows' cursors (row i at i mod L) so every step flushes a "
                         "1/L share of the rows, as in steady serving; window averages only")
    ap.add_argument("--out", default=os.environ.get("OUT", "reports/kernels"))
    args = ap.parse_args(argv)
    harness.HOLD_US = args.hold_us
    torch.manual_seed(0)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shapes = TINY_SHAPES if args.tiny else SHAPES
    args.shapes = list(shapes) if args.shapes is None else args.shapes
    unknown = [s for s in args.shapes if s not in shapes]
    if unknown:
        ap.error(f"unknown shape(s) {', '.join(unknown)}; known: {', '.join(shapes)}")
    cfgs = configs_for(list(dict.fromkeys(args.L)))  # a length given twice is timed once
    if args.configs:
        cfgs = [c for c in cfgs if c.label in args.configs or c.label.split("@")[0] in args.configs]
    vcfgs = [c for c in cfgs if c.label in VERIFY_CONFIGS] if args.verify_T else []
    if args.device == "cuda":
        precompile([(s, c, {}, args.verify_T if c in vcfgs else 0, "cuda")
                    for s in args.shapes for c in cfgs], args.workers, compile_batches(args.batch))
        dev = torch.cuda.get_device_name()
    else:
        dev = f"cpu (TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '0')})"
    bw = copy_bandwidth(device=args.device)
    print(f"device {dev}; copy bandwidth {bw / 1e12:.3f} TB/s (read + write)", flush=True)
    meta = dict(device=dev, copy_bandwidth=bw, torch=torch.__version__,
                triton=__import__("triton").__version__, argv=sys.argv, hold_us=harness.HOLD_US,
                layers=args.layers, stagger=args.stagger, window_only=args.window_only,
                complete=False)
    rows: list[dict] = []
    t_start = time.time()
    # batch-major: every shape's batch-256 numbers (the acceptance point) come first when the
    # batch list starts with 256; files are rewritten after every (batch, shape) block
    for batch in args.batch:
        for sname in args.shapes:
            if args.deadline and time.time() - t_start > args.deadline:
                print(f"deadline of {args.deadline:.0f} s reached: stopping before "
                      f"{sname} B={batch}", flush=True)
                write_outputs(out, rows, meta)
                return 0
            rows += measure_block(shapes[sname], sname, batch, cfgs, vcfgs, args, bw)
            write_outputs(out, rows, meta)
    meta["complete"] = True
    write_outputs(out, rows, meta)
    print(f"wrote {out / 'decode.csv'}, {out / 'decode.json'} and {out / 'decode.md'}"
          + (f"; {out / 'window_l.json'}, {out / 'window_l.csv'}" if _window_sweep(rows) else ""))
    return 0


def measure_block(shape: ModelShape, sname: str, batch: int, cfgs: list, vcfgs: list, args,
                  bw: float) -> list[dict]:
    """Every config of one (shape, batch), then the verify rows and FLA's peer kernel."""
    rows = []
    base, base_layers = None, 1
    mode = row_mode(args.layers, args.stagger)
    for cfg in cfgs:
        t0 = time.time()
        m = measure(shape, batch, cfg, args.reps, device=args.device, layers=args.layers,
                    stagger=args.stagger and cfg.L > 1,
                    window_only=args.window_only)
        sb = step_bytes(cfg, shape)
        row = dict(shape=sname, kind=shape.kind, batch=batch, config=cfg.label,
                   config_string=str(cfg), L=cfg.L, **m, mode=mode,
                   bytes_per_step=sb.window_average * batch,
                   nonflush_bytes=sb.nonflush * batch, flush_bytes=sb.flush * batch)
        row["bw_frac_window"] = row["bytes_per_step"] / (m["window_us"] * 1e-6) / bw
        row["bw_frac_nonflush"] = row["nonflush_bytes"] / (m["nonflush_us"] * 1e-6) / bw
        row["bw_frac_flush"] = row["flush_bytes"] / (m["flush_us"] * 1e-6) / bw
        if cfg.label == "fp32":
            base, base_layers = m["window_us"], m["layers"]
        row["speedup_vs_conv_fp32"] = base / m["window_us"] if base else float("nan")
        row["byte_bound_vs_conv_fp32"] = byte_bound(shape, cfg)
        row["plan"] = step_plan(shape, cfg, batch, args.device if args.device == "cuda"
                                else "interpreter").summary()  # what was timed
        rows.append(row)
        print(f"{sname:22s} B={batch:4d} {cfg.label:26s} win {m['window_us']:9.1f}us "
              f"nf {m['nonflush_us']:9.1f} (derived {m.get('nonflush_derived_us', m['nonflush_us']):9.1f}) "
              f"fl {m['flush_us']:9.1f} layers {m['layers']:3d} "
              f"bw {row['bw_frac_window']:.2f} x{row['speedup_vs_conv_fp32']:.2f} "
              f"({time.time() - t0:.1f}s)", flush=True)
    for cfg in vcfgs:
        try:
            t = measure_verify(shape, batch, cfg, args.verify_T, args.reps,
                               device=args.device, layers=args.layers)
        except Exception as e:  # noqa: BLE001 - reported in the log, the sweep goes on
            print(f"{sname:22s} B={batch:4d} verify {cfg.label}: {type(e).__name__}: {e}", flush=True)
            continue
        rows.append(dict(shape=sname, kind=shape.kind, batch=batch,
                         config=f"verify T={args.verify_T} {cfg.label}", mode=mode,
                         config_string=str(cfg), L=cfg.L, window_us=t, nonflush_us=t,
                         flush_us=t, verify_vs_conv_step=t / base if base else float("nan"),
                         speedup_vs_conv_fp32=base / t if base else float("nan")))
        print(f"{sname:22s} B={batch:4d} verify T={args.verify_T} {cfg.label:18s} {t:9.1f}us "
              f"= {t / base:.2f} conventional FP32 steps", flush=True)
    if shape.kind == "gdn" and args.device == "cuda":
        try:
            t = measure_fla(shape, batch, args.reps, layers=base_layers)
        except Exception as e:  # noqa: BLE001
            print(f"{sname:22s} B={batch:4d} FLA: {type(e).__name__}: {e}", flush=True)
            t = None
        if t is not None:
            sb = step_bytes(PRESETS["fp32"], shape)
            rows.append(dict(shape=sname, kind="gdn", batch=batch, config="fla-fused-recurrent",
                             mode=mode, layers=base_layers,
                             config_string="FLA fused_recurrent_gated_delta_rule fp32 state",
                             L=1, window_us=t, nonflush_us=t, flush_us=t,
                             bytes_per_step=sb.window_average * batch,
                             bw_frac_window=sb.window_average * batch / (t * 1e-6) / bw,
                             speedup_vs_conv_fp32=base / t if base else float("nan"),
                             byte_bound_vs_conv_fp32=1.0))
            print(f"{sname:22s} B={batch:4d} FLA fused recurrent     {t:9.1f}us", flush=True)
    return rows


def _layers_arg(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive count or 'auto', not {text!r}")
    return n


def row_mode(layers: int | str, stagger: bool) -> str:
    """How a sweep was timed, beyond the default (one layer, aligned cursors): "layers" (a
    step over several layers' states, ``--layers``), "stagger" (``--stagger``) or both; ""
    for the default. Every row of a sweep carries it, and ``benchmarks.targets`` judges each
    mode's rows apart."""
    return "+".join(m for m, on in (("layers", layers != 1), ("stagger", stagger)) if on)


def write_outputs(out: Path, rows: list[dict], meta: dict) -> None:
    """decode.json, decode.csv and decode.md (rewritten whole: a cut-off run keeps its rows),
    with the verdicts of the speed targets (``benchmarks.targets``) in the JSON and the Markdown;
    window_l.json / .csv / .md too when a preset was timed at two or more window lengths
    (``benchmarks.windows``)."""
    verdicts = evaluate(rows)
    md = markdown_table(rows, meta)
    if verdicts:
        md += "\n" + targets_markdown(verdicts) + "\n"
    write_rows(out, "decode", rows, dict(meta=meta, rows=rows, targets=[v.as_dict() for v in verdicts]),
               md)
    if _window_sweep(rows):
        write_window_table(out, rows, meta, {**SHAPES, **TINY_SHAPES})


def _window_sweep(rows: list[dict]) -> bool:
    return len({r["L"] for r in rows if r.get("L", 1) > 1 and "window_us" in r}) > 1


def byte_bound(shape, cfg) -> float:
    """The speed-up over the conventional FP32 step that the counted bytes allow: the ratio
    of their window-average state bytes (``step_bytes``, ring included)."""
    return step_bytes(PRESETS["fp32"], shape).window_average / step_bytes(cfg, shape).window_average


def markdown_table(rows: list[dict], meta: dict) -> str:
    """One table per (shape, batch): times, bandwidth fraction, ratio to conventional FP32 and
    the ratio the counted bytes allow; with the layers each row ran over where a sweep used
    more than one (``--layers``)."""
    lines = [f"# Decode-step kernels on {meta['device']}", "",
             f"Copy bandwidth measured in the same run: {meta['copy_bandwidth'] / 1e12:.3f} TB/s "
             f"(read + write). torch {meta['torch']}, Triton {meta['triton']}.",
             f"Command: `{' '.join(meta['argv'])}`", ""]
    if meta.get("layers", 1) != 1:
        lines += [f"Each step ran over several layers' caches in turn (`--layers "
                  f"{meta['layers']}`), so their states come from HBM as in a served model; "
                  "times are per layer.", ""]
    if meta.get("stagger"):
        lines += ["Rows' cursors staggered (`--stagger`): every step flushes a 1/L share of the "
                  "rows; window averages only.", ""]
    layered = any(r.get("layers", 1) > 1 for r in rows)
    keys = sorted({(r["shape"], r["batch"]) for r in rows}, key=lambda k: (k[0], k[1]))
    for shape, batch in keys:
        lines += [f"## {shape}, batch {batch}", "",
                  "| config | window us | non-flush us | flush us | bw (window) | vs conv FP32 "
                  "| bytes allow |" + (" layers |" if layered else ""),
                  "|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if layered else "")]
        for r in rows:
            if (r["shape"], r["batch"]) != (shape, batch):
                continue
            lines.append(f"| {r['config']} | {r['window_us']:.1f} | {r['nonflush_us']:.1f} | "
                         f"{r['flush_us']:.1f} | {r.get('bw_frac_window', float('nan')):.2f} | "
                         f"{r.get('speedup_vs_conv_fp32', float('nan')):.2f}x | "
                         f"{_ratio(r.get('byte_bound_vs_conv_fp32'))} |"
                         + (f" {r.get('layers', 1)} |" if layered else ""))
        lines.append("")
    return "\n".join(lines)


def _ratio(x) -> str:
    return "-" if x is None or x != x else f"{x:.2f}x"


if __name__ == "__main__":
    raise SystemExit(main())
