"""The timing harness every benchmark shares: CUDA-graph timing behind a GPU hold, the
device-to-device copy bandwidth that bandwidth fractions are taken against, and the rows'
JSON / CSV / Markdown writing.

A timed replay waits on the GPU behind a spin kernel (``HOLD_US``) while the host queues it,
so the time is the GPU's alone: without the hold the host's launch latency added 0.06-0.25 us
to every step at batch 1, repeats of a row spread by 1.3-2.2% (median) instead of 0.6-0.8%,
and the copy read 0.6-1.0% slower (below 0.1% at batch 256). Every graph is warmed for 30
replays and 20 ms first: on the H200 the first ~10 replays of a conventional step over a
fresh state run ~10% slower. Both were measured at commit 4ad331d with the hold on and off
(the ``--hold-us`` flag of ``python -m benchmarks.decode``).
"""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import torch


def copy_bandwidth(nbytes: int = 2 << 30, reps: int = 20, device: str = "cuda") -> float:
    """Device-to-device copy, bytes read + written per second, after a 1 s warm-up; each
    timed copy waits behind the same GPU hold as ``time_graph``'s replays. On a CPU (dry runs)
    the median of ``reps`` copies of 64 MiB."""
    if device != "cuda":
        a = torch.rand(min(nbytes, 64 << 20) // 4)
        b = torch.empty_like(a)
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            b.copy_(a)
            times.append(time.perf_counter() - t)
        return 2 * a.numel() * 4 / sorted(times)[len(times) // 2]
    a = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    b = torch.empty_like(a)
    t_end = time.time() + 1.0
    while time.time() < t_end:
        b.copy_(a)
    torch.cuda.synchronize()
    t = timed_replays(lambda: b.copy_(a), reps, 1, hold_cycles(HOLD_US) if HOLD_US > 0 else 0)
    return 2 * a.numel() * 4 / t


HOLD_US = 100.0  # GPU hold in front of each timed replay (``time_graph``); 0: none
_cycles_per_us: dict[int, float] = {}  # per device, from one timed sleep


def hold_cycles(us: float, cuda=torch.cuda) -> int:
    """Clock cycles of ``cuda._sleep`` that spin the GPU for about ``us`` microseconds, from
    one timed sleep of 2^21 cycles (measured once per process and device)."""
    dev = cuda.current_device()
    if dev not in _cycles_per_us:
        n = 1 << 21
        cuda._sleep(n)  # first launch outside the measurement
        st, en = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        st.record()
        cuda._sleep(n)
        en.record()
        en.synchronize()
        _cycles_per_us[dev] = n / (st.elapsed_time(en) * 1e3)
    return max(1, int(us * _cycles_per_us[dev]))


def timed_replays(replay, reps: int, repeat: int = 1, hold: int = 0, cuda=torch.cuda) -> float:
    """Median seconds per call over ``reps`` timed calls of ``replay`` (a graph holding
    ``repeat`` calls), each between two events. With ``hold`` > 0 a spin kernel of that many
    cycles goes in front of the start event: the host then queues the event, the replay and
    the end event while the GPU spins, so the start event fires with the replay already
    queued and the host's launch latency stays out of the time."""
    times = []
    for _ in range(reps):
        st, en = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        if hold:
            cuda._sleep(hold)
        st.record()
        replay()
        en.record()
        en.synchronize()
        times.append(st.elapsed_time(en) / 1e3 / repeat)
    times.sort()
    return times[len(times) // 2]


def time_graph(fn, reps: int = 20, warmup: int = 30, warm_s: float = 0.02,
               repeat: int = 1, hold_us: float | None = None) -> float:
    """Median seconds per call of ``fn`` captured ``repeat`` times in one CUDA graph (plain
    calls on a CPU, for dry runs). The graph is replayed ``warmup`` times and for at least
    ``warm_s`` seconds before timing: on the H200 the first ~10 replays of a step that
    rewrites a freshly allocated state run ~10% slower than every later one. ``repeat`` > 1
    keeps the launch gap of a lone replay out of the time, as a window of steps does. Each
    timed replay waits behind a GPU hold of ``hold_us`` (default ``HOLD_US``; 0: none,
    ``timed_replays``): at batch 1 the host's launch latency otherwise added 0.06-0.25 us to
    every step of a 16-step graph."""
    if not torch.cuda.is_available():
        fn()
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()  # compile + warm outside capture
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(repeat):
            fn()
    t_end, n = time.perf_counter() + warm_s, 0
    while n < warmup or time.perf_counter() < t_end:
        g.replay()
        n += 1
        if n % 8 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    us = HOLD_US if hold_us is None else hold_us
    return timed_replays(g.replay, reps, repeat, hold_cycles(us) if us > 0 else 0)


def write_rows(out: Path, stem: str, rows: list[dict], payload: dict, markdown: str) -> None:
    """``<stem>.json`` (``payload``), ``<stem>.csv`` (``rows``, one column per key any row has)
    and ``<stem>.md`` under ``out``, each rewritten whole so a cut-off run keeps its rows."""
    (out / f"{stem}.json").write_text(json.dumps(payload, indent=1))
    keys = sorted({k for r in rows for k in r})
    with open(out / f"{stem}.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=keys)
        wr.writeheader()
        wr.writerows(rows)
    (out / f"{stem}.md").write_text(markdown)
