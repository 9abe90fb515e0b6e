"""Why did the conventional FP32 step time 269-297 us on Qwen3.5-4B depending on the process?
Probes of the timing harness itself (CUDA), one per question, each printing what it measured:

    python3 benchmarks/probe_timing.py inplace   # in place vs a new buffer; FLA beside ours (r82)
    python3 benchmarks/probe_timing.py warm      # read-only bandwidth; idle, busy, new allocation (r83)
    python3 benchmarks/probe_timing.py clocks    # wall-clock stamps to line up with nvidia-smi (r84)
    python3 benchmarks/probe_timing.py data      # does the state's content matter? (r85)
    python3 benchmarks/probe_timing.py ramp      # per-replay times from a fresh workload (r86)
    python3 benchmarks/probe_timing.py harness   # 3 warm-up replays against 30 / 20 ms (r87)
    python3 benchmarks/probe_timing.py hold      # a GPU hold before each timed replay (r188)
    python3 benchmarks/probe_timing.py nonflush  # non-flush steps alone, and after a rest (r262)

The logs are ``reports/kernels/probe_r8[2-7]_*.log``; ``clocks`` ran beside
``nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,
clocks_throttle_reasons.active --format=csv -lms 25`` (``probe_r84_smi.csv``). The first four
time with the harness of that time, 3 warm-up replays (``OLD``); the answer (``ramp``): the
first ~10 replays of a conventional FP32 step on a freshly allocated state run ~10% slower,
so ``decode.time_graph`` now warms each graph for 30 replays and 20 ms. ``harness`` (r87)
ran before conventional steps were timed 16 to a graph and flushes 4 to a graph, so its
conventional and flush times today include less launch cost than its log's. ``hold``
(``probe_r188_hold.log``) answered why batch-1 rows moved by up to 15% between runs: the
host's launch latency sat inside every timed replay, so ``decode.time_graph`` now queues each
replay behind a GPU hold. ``nonflush`` (``probe_r262_nonflush.log``, beside the same
``nvidia-smi`` query, ``probe_r262_smi.csv``) asks why the non-flush steps timed alone
(``decode.time_nonflush``) took up to 5% longer at batch 512 than their share of the window.
"""

# ruff: noqa: B023 - every closure here is timed within the loop iteration that made it

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import decode as D  # noqa: E402

from replayssm_quant.precision import PRESETS, SHAPES, step_bytes  # noqa: E402

OLD = dict(warmup=3, warm_s=0.0, hold_us=0.0)  # the harness before the warm-up fix


def old_graph(fn, reps: int = 20) -> float:
    return D.time_graph(fn, reps, **OLD)


@triton.jit
def _tile_kernel(src, dst, ROWS: tl.constexpr, K: tl.constexpr, SCALE: tl.constexpr):
    """Load a (ROWS, K) fp32 tile, scale it, store it (in place when src is dst)."""
    pid = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, ROWS)[:, None] * K + tl.arange(0, K)[None, :]
    x = tl.load(src + pid * ROWS * K + r)
    tl.store(dst + pid * ROWS * K + r, x * SCALE)


@triton.jit
def _read_kernel(src, dst, ROWS: tl.constexpr, K: tl.constexpr):
    """Read a (ROWS, K) fp32 tile, store its row sums: read-only traffic."""
    pid = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, ROWS)[:, None] * K + tl.arange(0, K)[None, :]
    x = tl.load(src + pid * ROWS * K + r)
    tl.store(dst + pid * ROWS + tl.arange(0, ROWS), tl.sum(x, 1))


STATE = 256 * 32 * 128 * 128  # Qwen3.5-4B fp32 states at batch 256


def per_replay(fn, n: int, eager: int = 1, div: int = 1) -> list[float]:
    """Microseconds of each of the first ``n`` replays of a new graph of ``fn`` (/ ``div``)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(eager):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    out = []
    for _ in range(n):
        st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        st.record()
        g.replay()
        en.record()
        en.synchronize()
        out.append(st.elapsed_time(en) * 1e3 / div)
    return out


def _fmt(xs: list[float]) -> str:
    return " ".join(f"{x:.0f}" for x in xs)


def probe_inplace(cb: float) -> None:
    """Copy / mul_ / a tile kernel in place and into a new buffer; our conventional GDN step
    against FLA's fused recurrent kernel writing a new buffer, in place, and on our cache."""
    from fla.ops.gated_delta_rule import fused_recurrent as fr

    fk = fr.fused_recurrent_gated_delta_rule_fwd_kernel

    def bw(fn, nbytes):
        return nbytes / old_graph(fn) / 1e12

    for mb in (512, 1024, 2048):
        n = mb * (1 << 20) // 4
        a = torch.rand(n, device="cuda")
        b = torch.empty_like(a)
        print(f"{mb} MB: copy {bw(lambda: b.copy_(a), 8 * n):.3f}  out mul "
              f"{bw(lambda: torch.mul(a, 1.0, out=b), 8 * n):.3f}  inplace mul_ "
              f"{bw(lambda: a.mul_(1.0), 8 * n):.3f}  inplace add_ {bw(lambda: a.add_(b), 12 * n):.3f}",
              flush=True)
        a = b = None
    a = torch.rand(STATE, device="cuda")
    b = torch.empty_like(a)
    for rows, w in ((8, 1), (16, 1), (32, 1), (32, 4), (128, 4), (128, 8)):
        g = (STATE // (rows * 128),)
        t_out = bw(lambda: _tile_kernel[g](a, b, rows, 128, 0.999, num_warps=w), 8 * STATE)
        t_in = bw(lambda: _tile_kernel[g](a, a, rows, 128, 0.999, num_warps=w), 8 * STATE)
        print(f"triton tile rows={rows} warps={w}: out-of-place {t_out:.3f} ({t_out * 1e12 / cb:.2f})"
              f"  in-place {t_in:.3f} ({t_in * 1e12 / cb:.2f})", flush=True)
    a = b = None
    for sname in ("qwen3.5-4b", "qwen3.5-122b-a10b"):
        shape = SHAPES[sname]
        H, V, K, G = shape.heads, shape.head_dim, shape.d_state, shape.groups
        for batch in (256, 512):
            w = D.Workload(shape, batch, PRESETS["fp32"], steps=2)
            t_conv = old_graph(lambda: w.step(0)) * 1e6
            inp = w.inputs[0]
            q, k, v, gg = (inp[n].unsqueeze(1).contiguous() for n in ("q", "k", "v", "g"))
            beta = inp["beta"].unsqueeze(1).to(torch.bfloat16).contiguous()
            h0 = torch.randn(batch, H, V, K, device="cuda") * 0.05
            ht, o = torch.empty_like(h0), torch.empty_like(v)

            def fla(dst, src=h0, BV=8):
                fk[(triton.cdiv(V, BV) * batch * H,)](
                    q=q, k=k, v=v, g=gg, gk=None, gv=None, beta=beta, A_log=None, dt_bias=None,
                    o=o, h0=src, ht=dst, cu_seqlens=None, scale=K**-0.5, T=1, H=G, HV=H, K=K,
                    V=V, BK=K, BV=BV, IS_BETA_HEADWISE=True, USE_QK_L2NORM_IN_KERNEL=False,
                    APPLY_BETA_SIGMOID=False, ALLOW_NEG_EIGVAL=False, STATE_V_FIRST=True,
                    num_warps=1, num_stages=3)

            res = [f"{sname} B={batch}: our conv {t_conv:.1f} us"]
            st = w.cache.ckpt.data.view(-1)[: batch * H * V * K].view(batch, H, V, K)
            for BV in (8, 16, 32):
                t1 = old_graph(lambda: fla(ht, BV=BV)) * 1e6
                t2 = old_graph(lambda: fla(h0, BV=BV)) * 1e6
                t3 = old_graph(lambda: fla(st, src=st, BV=BV)) * 1e6
                res.append(f"FLA BV={BV}: new buf {t1:.1f} in place {t2:.1f} on our cache {t3:.1f}")
            res.append(f"our conv again {old_graph(lambda: w.step(0)) * 1e6:.1f}")
            print(" | ".join(res), flush=True)
            w = h0 = ht = None
            torch.cuda.empty_cache()


def _busy(sec: float) -> None:
    x = torch.rand(1 << 28, device="cuda")
    y = torch.empty_like(x)
    t = time.time()
    while time.time() - t < sec:
        y.copy_(x)
    torch.cuda.synchronize()


def probe_warm(cb: float) -> None:
    """Read-only bandwidth, then the conventional step after 2 s idle, per replay, after 1 s
    of copies, after a ReplaySSM window, and on a new allocation."""
    a = torch.rand(STATE, device="cuda")
    b = torch.empty(STATE // 8, device="cuda")
    for rows, w in ((8, 1), (16, 1), (32, 1), (32, 4), (64, 4)):
        g = (STATE // (rows * 128),)
        t = old_graph(lambda: _read_kernel[g](a, b, rows, 128, num_warps=w))
        print(f"read-only rows={rows} warps={w}: {4 * STATE / t / 1e12:.3f} TB/s "
              f"({4 * STATE / t / cb:.2f} of copy)", flush=True)
    t = old_graph(lambda: torch.sum(a))
    print(f"torch.sum: {4 * STATE / t / 1e12:.3f} TB/s ({4 * STATE / t / cb:.2f})", flush=True)
    a = b = None
    for sname, shape in SHAPES.items():
        sb = step_bytes(PRESETS["fp32"], shape).window_average * 256
        w = D.Workload(shape, 256, PRESETS["fp32"], steps=2)

        def f(t):
            return f"{t:.1f} ({sb / (t * 1e-6) / cb:.2f})"

        time.sleep(2.0)
        t_idle = old_graph(lambda: w.step(0), 10) * 1e6
        pr = per_replay(lambda: w.step(0), 30)
        _busy(1.0)
        t_warm = old_graph(lambda: w.step(0), 10) * 1e6
        D.time_graph, tg = (lambda fn, reps=20: old_graph(fn, reps)), D.time_graph
        try:
            m = D.measure(shape, 256, PRESETS["replay-fp32"], 10)
        finally:
            D.time_graph = tg
        t_after = old_graph(lambda: w.step(0), 10) * 1e6
        w = None
        torch.cuda.empty_cache()
        w2 = D.Workload(shape, 256, PRESETS["fp32"], steps=2)
        t_new = old_graph(lambda: w2.step(0), 10) * 1e6
        w2 = None
        torch.cuda.empty_cache()
        print(f"{sname}: conv after 2 s idle {f(t_idle)}; per replay first 5 "
              f"{[round(x, 1) for x in pr[:5]]} median {sorted(pr)[15]:.1f}; after 1 s busy "
              f"{f(t_warm)}; replay-fp32 win {m['window_us']:.1f} nf {m['nonflush_us']:.1f} fl "
              f"{m['flush_us']:.1f}; conv after {f(t_after)}; new alloc {f(t_new)}", flush=True)


def probe_clocks(cb: float) -> None:
    """The conventional step and the ReplaySSM window timed repeatedly, wall-clock stamped."""
    t0 = time.time()

    def log(msg):
        print(f"[{time.strftime('%H:%M:%S', time.gmtime())}.{int((time.time() % 1) * 1000):03d} "
              f"+{time.time() - t0:6.2f}s] {msg}", flush=True)

    log(f"copy bw {cb / 1e12:.3f}")
    D.time_graph, tg = (lambda fn, reps=20: old_graph(fn, reps)), D.time_graph
    try:
        for sname in ("qwen3.5-4b", "nemotron-3-super-120b"):
            shape = SHAPES[sname]
            w = D.Workload(shape, 256, PRESETS["fp32"], steps=2)
            torch.cuda.synchronize()
            log(f"{sname} workload ready")
            for i in range(4):
                log(f"conv time_graph #{i}: {old_graph(lambda: w.step(0), 10) * 1e6:.1f} us")
            time.sleep(0.5)
            log(f"conv after 0.5 s sleep: {old_graph(lambda: w.step(0), 10) * 1e6:.1f} us")
            log(f"conv 50 reps: {old_graph(lambda: w.step(0), 50) * 1e6:.1f} us")
            for i in range(2):
                m = D.measure(shape, 256, PRESETS["replay-fp32"], 10)
                log(f"replay-fp32 #{i}: win {m['window_us']:.1f} nf {m['nonflush_us']:.1f} "
                    f"fl {m['flush_us']:.1f}")
            log(f"conv again: {old_graph(lambda: w.step(0), 10) * 1e6:.1f} us")
            if shape.kind == "gdn":
                for i in range(2):
                    log(f"FLA #{i}: {D.measure_fla(shape, 256, 10):.1f} us")
                log(f"conv again: {old_graph(lambda: w.step(0), 10) * 1e6:.1f} us")
            w = None
            torch.cuda.empty_cache()
    finally:
        D.time_graph = tg


def probe_data(cb: float) -> None:
    """Tile kernels on random, scaled, zero and constant data; the conventional step on its
    evolved state, a refilled random state and a zero state."""
    a = torch.empty(STATE, device="cuda")
    b = torch.empty_like(a)
    g = (STATE // (16 * 128),)

    def tbw(fn):
        return 8 * STATE / old_graph(fn) / cb

    for name, init in (("randn", lambda: a.normal_()), ("randn*0.05", lambda: a.normal_().mul_(0.05)),
                       ("zeros", lambda: a.zero_()), ("ones", lambda: a.fill_(1.0)),
                       ("rand bf16-rounded",
                        lambda: a.copy_(torch.randn(STATE, device="cuda").bfloat16().float()))):
        init()
        b.copy_(a)
        print(f"data {name:12s}: tile out {tbw(lambda: _tile_kernel[g](a, b, 16, 128, 1.0, num_warps=1)):.3f}"
              f"  tile in-place {tbw(lambda: _tile_kernel[g](a, a, 16, 128, 1.0, num_warps=1)):.3f}"
              f"  torch copy {tbw(lambda: b.copy_(a)):.3f}", flush=True)
    a = b = None
    for sname in ("qwen3.5-4b", "nemotron-3-super-120b"):
        w = D.Workload(SHAPES[sname], 256, PRESETS["fp32"], steps=2)
        res = [f"same-input #{i} {old_graph(lambda: w.step(0), 10) * 1e6:.1f}" for i in range(3)]
        D._fill_state(w.cache)
        res.append(f"refilled random {old_graph(lambda: w.step(0), 10) * 1e6:.1f}")
        res.append(f"again {old_graph(lambda: w.step(0), 10) * 1e6:.1f}")
        w.cache.ckpt.data.zero_()
        res.append(f"zero state {old_graph(lambda: w.step(0), 10) * 1e6:.1f}")
        D._fill_state(w.cache)
        for tag in ("refilled, alternating inputs", "again"):
            res.append(f"{tag} {old_graph(lambda: (w.step(0), w.step(1)), 10) * 1e6 / 2:.1f}")
        print(sname, " | ".join(res), flush=True)
        w = None
        torch.cuda.empty_cache()


def probe_ramp(cb: float) -> None:
    """Per-replay times of new graphs on fresh workloads: the conventional step (after 1 and
    40 eager steps) and the ReplaySSM window (per step)."""
    for sname in ("qwen3.5-4b", "nemotron-3-super-120b"):
        shape = SHAPES[sname]
        for eager in (1, 40):
            w = D.Workload(shape, 256, PRESETS["fp32"], steps=2)
            print(f"{sname} conv fresh, {eager} eager: "
                  f"{_fmt(per_replay(lambda: w.step(0), 60 if eager == 1 else 30, eager=eager))}",
                  flush=True)
            w = None
            torch.cuda.empty_cache()
        cfg = PRESETS["replay-fp32"]
        w = D.Workload(shape, 256, cfg, steps=cfg.L)
        w.cache.cursor.zero_()
        print(f"{sname} replay-fp32 window fresh (us/step): "
              f"{_fmt(per_replay(lambda: [w.step(i) for i in range(cfg.L)], 30, div=cfg.L))}",
              flush=True)
        w = None
        torch.cuda.empty_cache()


def probe_harness(cb: float) -> None:
    """decode.measure with the old warm-up and the new one, alternating, each on a fresh
    workload, for four presets, batch 256 and 1, and FLA."""
    new = D.time_graph
    old = lambda fn, reps=20, repeat=1: new(fn, reps, repeat=repeat, **OLD)  # noqa: E731
    try:
        for sname, shape in SHAPES.items():
            for batch in (256, 1):
                for cname in ("fp32", "replay-fp32", "nvfp4-read/fp16-sr", "fp16-sr", "fp32"):
                    out = []
                    for tag, tg in (("old", old), ("new", new)) * 2:
                        D.time_graph = tg
                        m = D.measure(shape, batch, PRESETS[cname], 10)
                        out.append(f"{tag} {m['window_us']:.1f}/{m['nonflush_us']:.1f}/{m['flush_us']:.1f}")
                    print(f"{sname} B={batch} {cname:20s} win/nf/fl: " + " | ".join(out), flush=True)
                if shape.kind == "gdn":
                    out = []
                    for tag, tg in (("old", old), ("new", new)) * 2:
                        D.time_graph = tg
                        out.append(f"{tag} {D.measure_fla(shape, batch, 10):.1f}")
                    print(f"{sname} B={batch} FLA: " + " | ".join(out), flush=True)
                torch.cuda.empty_cache()
    finally:
        D.time_graph = new


B1_PRESETS = ("fp32", "replay-fp32", "replay-fp32@L8", "nvfp4-read/fp16-sr",
              "nvfp4-read/fp8-sr@L8", "shared-fp8@L8")


def probe_hold(cb: float) -> None:
    """decode.measure without and with a GPU hold in front of each timed replay, alternating
    in one process: every shape at batch 1 for six presets, three rounds; other hold lengths
    (10, 30, 300 us) on two shapes; FLA at batch 1; two shapes at batch 256; the copy."""
    cfgs = {c.label: c for c in D.configs_for([8, 16])}
    D.precompile([(s, cfgs[c], {}, 0, "cuda") for s in SHAPES for c in B1_PRESETS], 14)
    hold = D.HOLD_US

    def row(sname, batch, cname, holds):
        out = []
        for h in holds:
            D.HOLD_US = h
            m = D.measure(SHAPES[sname], batch, cfgs[cname], 10)
            out.append(f"h{h:g}: win {m['window_us']:8.2f} nf {m['nonflush_us']:8.2f} "
                       f"fl {m['flush_us']:8.2f}")
        return " | ".join(out)

    try:
        for r in range(3):
            for sname in SHAPES:
                for cname in B1_PRESETS:
                    print(f"B=  1 r{r} {sname:22s} {cname:22s} {row(sname, 1, cname, (0, 100))}",
                          flush=True)
        for sname in ("nemotron-3-super-120b", "qwen3.5-4b"):
            for cname in ("fp32", "replay-fp32@L8"):
                print(f"B=  1 r0 {sname:22s} {cname:22s} {row(sname, 1, cname, (10, 30, 300))}",
                      flush=True)
        for sname in ("qwen3.5-4b", "qwen3.5-122b-a10b"):
            out = []
            for h in (0, 100, 0, 100):
                D.HOLD_US = h
                out.append(f"h{h} {D.measure_fla(SHAPES[sname], 1, 10):.2f}")
            print(f"B=  1 FLA {sname:22s} " + " | ".join(out), flush=True)
        for r in range(2):
            for sname in ("nemotron-3-super-120b", "qwen3.5-4b"):
                for cname in ("fp32", "replay-fp32"):
                    print(f"B=256 r{r} {sname:22s} {cname:22s} {row(sname, 256, cname, (0, 100))}",
                          flush=True)
        out = []
        for h in (0, 100) * 3:
            D.HOLD_US = h
            out.append(f"h{h} {D.copy_bandwidth() / 1e12:.4f}")
        print("copy TB/s: " + " | ".join(out), flush=True)
    finally:
        D.HOLD_US = hold


NONFLUSH_CASES = (("nemotron-3-super-120b", "nvfp4-read/fp16-sr"), ("qwen3.5-122b-a10b", "fp8-read/fp32"),
                  ("nemotron-3-super-120b", "replay-fp32"))


def probe_nonflush(cb: float, batch: int = 512) -> None:
    """Per case, wall-clock stamped: ``decode.measure`` (window, the non-flush step timed
    alone, the flush alone, the derived non-flush step), then the non-flush steps timed with a
    GPU rest as long as the flush after them in each replay (a spin kernel, whose time alone
    is taken off): if the steps alone are slower for want of the rest a window's flush gives
    the memory, they come back to the window's share here."""
    D.precompile([(s, PRESETS[c], {}, 0, "cuda") for s, c in NONFLUSH_CASES], 4, (batch,))
    t0 = time.time()
    for sname, cname in NONFLUSH_CASES:
        cfg = PRESETS[cname]
        for rnd in range(2):
            m = D.measure(SHAPES[sname], batch, cfg, 10, device="cuda")
            w = D.Workload(SHAPES[sname], batch, cfg, steps=cfg.L)
            rest = D.hold_cycles(m["flush_us"])

            def reset():
                w.cache.cursor.zero_()

            def nonflush(rest_cycles=0):
                reset()
                for i in range(cfg.L - 1):
                    w.step(i)
                if rest_cycles:
                    torch.cuda._sleep(rest_cycles)

            def rest_only():
                reset()
                torch.cuda._sleep(rest)

            t_rest = (D.time_graph(lambda: nonflush(rest), 10) - D.time_graph(rest_only, 10)) \
                / (cfg.L - 1) * 1e6
            print(f"+{time.time() - t0:6.1f}s B={batch} {sname:22s} {cname:20s} r{rnd} "
                  f"win {m['window_us']:8.1f} nf {m['nonflush_us']:8.1f} "
                  f"nf-derived {m['nonflush_derived_us']:8.1f} fl {m['flush_us']:8.1f} "
                  f"nf-after-rest {t_rest:8.1f}", flush=True)
            w = None


PROBES = {"inplace": probe_inplace, "warm": probe_warm, "clocks": probe_clocks,
          "data": probe_data, "ramp": probe_ramp, "harness": probe_harness, "hold": probe_hold,
          "nonflush": probe_nonflush}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("probe", choices=list(PROBES))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("probe_timing times CUDA graphs: it needs a GPU")
    cb = D.copy_bandwidth()
    print(f"copy bw {cb / 1e12:.3f} TB/s", flush=True)
    PROBES[args.probe](cb)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
