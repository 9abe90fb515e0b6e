"""The kernels exactly as the vLLM plugin drives them, inside a CUDA graph, against the reference.

No vLLM is imported (the H200 runs torch 2.11; vLLM 0.33 needs torch 2.14). What is shared with
the plugin is everything below vLLM's own code: the page layout
(``replayssm_quant.vllm_plugin.layout``), the views cut from the pages, the input conversion
and slot mapping, and the post-prefill refresh (``replayssm_quant.vllm_plugin.runtime``).

For each layer type (Mamba-2 on Nemotron-3-Super's shape, GDN on Qwen3.5-4B's by default;
``--mamba2-shape`` / ``--gdn-shape`` pick another paper shape; TP=1, bf16 activations) and
every preset:

* one int8 tensor of ``num_blocks`` pages, padded like vLLM pads a hybrid page, with the
  plugin's layout; block 0 is vLLM's null block;
* decode inputs in the form vLLM hands its kernels (strided views of the conv output, ``dt``
  before bias/softplus expanded over head_dim, GDN ``q``/``k`` before normalisation, raw gates),
  8 rows of which 2 are CUDA-graph padding rows (null block);
* one CUDA graph captured with padding rows only, then replayed for every decode step of a
  sequence: prefill refresh of 6 slots -> decode -> preemption (2 requests re-admitted in new
  blocks and refreshed, so rows sit at different ring positions) -> rows reordered (vLLM
  condenses its persistent batch) -> decode through several flushes.

Checked at every step: the graph's output against the reference step
(``replayssm_quant.ssm.mamba2/gdn.decode_step``) started from the page's exact state, the stored
checkpoint and read copy against the reference's (SR words identical; float reduction order may
move a rare element across a rounding boundary, by one grid step), cursor and flush index,
graph replay == eager call bit for bit, and the null block's page never written.

    python -m benchmarks.vllm_page_graph            # all presets, both layer types (< 2 min)
    python -m benchmarks.vllm_page_graph --quick    # three presets
    python -m benchmarks.vllm_page_graph --kinds mamba2 --mamba2-shape nemotron-3-nano-4b
    TRITON_INTERPRET=1 python -m benchmarks.vllm_page_graph --device cpu --tiny --L 4 --steps 14
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from replayssm_quant import formats as QF
from replayssm_quant.precision import PRESETS, SHAPES, ModelShape
from replayssm_quant.ssm import gdn as gdn_ref
from replayssm_quant.ssm import mamba2 as mamba2_ref
from replayssm_quant.vllm_plugin import runtime
from replayssm_quant.vllm_plugin.layout import vllm_page, with_buffer_len

ROWS, REAL = 8, 6  # graph batch: 6 requests + 2 padding rows
NUM_BLOCKS = 12
PAGE_PAD = 4096  # vLLM pads the SSM page up to the attention page; any multiple of 16
ACT = torch.bfloat16
TINY = {"mamba2": ModelShape("tiny-mamba2", "mamba2", 4, 16, 32, 2),
        "gdn": ModelShape("tiny-gdn", "gdn", 4, 16, 32, 2)}


@dataclass
class Result:
    kind: str
    preset: str
    steps: int = 0
    flushes: int = 0
    out_err: float = 0.0
    state_diff: float = 0.0
    graph_eq_eager: bool = True
    null_untouched: bool = True
    counters_ok: bool = True
    refresh_exact: bool = True
    tma: bool = False  # the persistent flush moved the page's checkpoint through TMA
    seconds: float = 0.0
    error: str = ""

    @property
    def ok(self) -> bool:
        return (not self.error and self.out_err <= 1e-3 and self.state_diff < 0.02
                and self.graph_eq_eager and self.null_untouched and self.counters_ok
                and self.refresh_exact)


class Layer:
    """One layer's pages (graph copy and eager copy), its reference state, and vLLM-form inputs."""

    def __init__(self, shape: ModelShape, cfg, device: torch.device, seed: int) -> None:
        self.shape, self.cfg, self.device = shape, cfg, device
        self.kind = shape.kind
        self.layout = vllm_page(shape, cfg)
        stride = self.layout.page_bytes + PAGE_PAD
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.layer_index, self.seed = 7, 1234
        self.caches = []
        self.pages = []
        for _ in range(2):  # [graph, eager]
            pages = torch.zeros(NUM_BLOCKS, stride, dtype=torch.int8, device=device)
            cache = runtime.cache_from_page(
                self.layout, pages, cfg,
                cursor=torch.zeros(NUM_BLOCKS, dtype=torch.int32, device=device),
                flush_index=torch.zeros(NUM_BLOCKS, dtype=torch.int32, device=device),
                nan_count=torch.zeros(1, dtype=torch.int32, device=device),
                layer=self.layer_index, seed=self.seed)
            self.pages.append(pages)
            self.caches.append(cache)
        H, P, N, G = shape.heads, shape.head_dim, shape.d_state, shape.groups
        common = dict(layer=self.layer_index, seed=self.seed, act_dtype=ACT, device=device)
        if self.kind == "mamba2":
            self.ref = mamba2_ref.init_mamba2_state(cfg, NUM_BLOCKS, H, P, N, G, **common)
            self.A = -(torch.rand(H, generator=self.gen, device=device) * 8 + 1)
            self.D = torch.randn(H, generator=self.gen, device=device)
            self.dt_bias = torch.randn(H, generator=self.gen, device=device) * 0.5 - 3
        else:
            self.ref = gdn_ref.init_gdn_state(cfg, NUM_BLOCKS, H, P, N, G, **common)
            self.A_log = torch.rand(H, generator=self.gen, device=device) * 2 - 4
            self.dt_bias = torch.randn(H, generator=self.gen, device=device)
        self.static = self._new_inputs(padding_only=True)

    # ---------------------------------------------------------------- inputs in vLLM's form
    def _new_inputs(self, slots: list[int] | None = None, padding_only: bool = False) -> dict:
        s, g, d = self.shape, self.gen, self.device
        H, P, N, G = s.heads, s.head_dim, s.d_state, s.groups

        def rnd(*shape, scale=1.0):
            return (torch.randn(*shape, generator=g, device=d) * scale).to(ACT)

        idx = torch.zeros(ROWS, 1, dtype=torch.int32, device=d)  # null block everywhere
        if not padding_only:
            idx[:REAL, 0] = torch.tensor(slots, dtype=torch.int32, device=d)
        if self.kind == "mamba2":
            # x, B, C are column slices of the conv output (strided), dt a slice of in_proj
            conv = rnd(ROWS, H * P + 2 * G * N + 8)
            x = conv[:, : H * P].view(ROWS, H, P)
            Bm = conv[:, H * P: H * P + G * N].view(ROWS, G, N)
            C = conv[:, H * P + G * N: H * P + 2 * G * N].view(ROWS, G, N)
            dt = rnd(ROWS, H + 3, scale=0.5)[:, :H]
            return dict(x=x, dt=dt, B=Bm, C=C, idx=idx)
        hk, K, V = s.groups, s.d_state, s.head_dim
        mixed = rnd(ROWS, 2 * hk * K + H * V + 5)
        q = mixed[:, : hk * K].view(ROWS, hk, K)
        k = mixed[:, hk * K: 2 * hk * K].view(ROWS, hk, K)
        v = mixed[:, 2 * hk * K: 2 * hk * K + H * V].view(ROWS, H, V)
        return dict(q=q, k=k, v=v, a=rnd(ROWS, H), b=rnd(ROWS, H), idx=idx)

    def load(self, inputs: dict) -> None:
        """Copy one step's inputs into the graph's static buffers (vLLM's persistent buffers)."""
        for key, t in inputs.items():
            self.static[key].copy_(t)

    def run(self, cache, inp: dict):
        """One decode step, exactly the plugin's call for this layer type."""
        if self.kind == "mamba2":
            H, P, N = self.shape.heads, self.shape.head_dim, self.shape.d_state
            out = torch.empty(ROWS, H, P, dtype=ACT, device=self.device)
            y = runtime.mamba2_decode(
                cache, inp["x"], inp["dt"][:, :, None].expand(-1, -1, P),
                self.A[:, None, None].expand(-1, P, N), inp["B"], inp["C"],
                self.D[:, None].expand(-1, P), self.dt_bias[:, None].expand(-1, P),
                dt_softplus=True, state_indices=inp["idx"], out=out)
            return y, out
        g, beta = runtime.gdn_gates(self.A_log, inp["a"], self.dt_bias, inp["b"])
        K = self.shape.d_state
        y = runtime.gdn_decode(cache, inp["q"], inp["k"], inp["v"], g, beta,
                               state_indices=inp["idx"].view(-1), scale=K ** -0.5,
                               normalize=True)
        return y, None

    # ---------------------------------------------------------------- reference
    def sync_reference(self) -> None:
        """The reference starts each step from the page's exact state (graph copy)."""
        cache, ref = self.caches[0], self.ref
        for st, q in ((cache.ckpt, ref.ckpt), (cache.read, ref.read)):
            if st is None:
                continue
            q.data.copy_(st.data)
            for f in ("row_scale", "block_scale"):
                if getattr(st, f) is not None:
                    getattr(q, f).copy_(getattr(st, f))
        for name, t in cache.ring.items():
            getattr(ref, name).copy_(t)
        ref.cursor.copy_(cache.cursor)
        ref.flush_index.copy_(cache.flush_index)

    def reference_step(self, inp: dict) -> torch.Tensor:
        slots = inp["idx"][:, 0].long()
        slots = torch.where(slots > 0, slots, torch.full_like(slots, -1))
        if self.kind == "mamba2":
            dt = F.softplus(inp["dt"].float() + self.dt_bias)
            return mamba2_ref.decode_step(self.ref, inp["x"], dt, self.A, inp["B"], inp["C"],
                                          self.D, slots)
        K = self.shape.d_state
        g, beta = runtime.gdn_gates(self.A_log, inp["a"], self.dt_bias, inp["b"])
        q = runtime.l2norm(inp["q"]) * K ** -0.5
        k = runtime.l2norm(inp["k"]).to(ACT)
        return gdn_ref.decode_step(self.ref, q, k, inp["v"], g, beta, slots)

    def refresh(self, slots: list[int]) -> bool:
        """Post-prefill refresh on both page copies and the reference; True if the stored
        checkpoints and read copies are bit-identical to the reference's ``load_state``."""
        s = self.shape
        st = torch.randn(len(slots), s.heads, s.head_dim, s.d_state, generator=self.gen,
                         device=self.device) * 0.3
        idx = torch.tensor(slots, device=self.device)
        for cache in self.caches:
            runtime.refresh_after_prefill(cache, idx, st)
        self.sync_reference()
        mod = mamba2_ref if self.kind == "mamba2" else gdn_ref
        mod.load_state(self.ref, idx, st)
        ok = True
        cache = self.caches[0]
        for pst, q in ((cache.ckpt, self.ref.ckpt), (cache.read, self.ref.read)):
            if pst is None:
                continue
            ok &= bool(torch.equal(pst.data[idx].view(torch.uint8), q.data[idx].view(torch.uint8)))
            for f in ("row_scale", "block_scale"):
                if getattr(pst, f) is not None:
                    a, b = getattr(pst, f)[idx], getattr(q, f)[idx]
                    ok &= bool(torch.equal(a.view(torch.uint8), b.view(torch.uint8)))
        return ok

    def state_mismatch(self, slots: list[int]) -> float:
        """Fraction of stored elements (checkpoint, read copy) that differ from the reference
        by more than float32 rounding; each such element must be within one grid step."""
        idx = torch.tensor(slots, device=self.device)
        cache, worst = self.caches[0], 0.0
        for st, q, fmt in ((cache.ckpt, self.ref.ckpt, self.cfg.ckpt),
                           (cache.read, self.ref.read, self.cfg.read)):
            if st is None:
                continue
            got = runtime.dequantize_checkpoint(
                type(cache)(self.cfg, cache.kind, st, None, {}, cache.cursor, cache.flush_index,
                            cache.nan_count, 0), idx)
            want = QF.dequantize(QF.QTensor(q.fmt, q.data[idx],
                                            None if q.row_scale is None else q.row_scale[idx],
                                            None if q.block_scale is None else
                                            q.block_scale[idx]))
            rowmax = want.abs().amax(-1, keepdim=True).nan_to_num(0).clamp_min(1e-30)
            same = (got - want).abs() <= 1e-5 * rowmax
            step = 2.0 ** -fmt.mantissa * (2 if fmt.name != "nvfp4" else 4)
            near = (got - want).abs() <= step * torch.maximum(want.abs(), rowmax / 8) + 1e-6
            if not bool((same | near).all()):
                return 1.0
            worst = max(worst, 1 - same.float().mean().item())
        return worst


def schedule(steps: int) -> list[tuple]:
    """Events: ("refresh", slots) | ("decode", slots of the 6 real rows)."""
    rows = [3, 1, 4, 6, 2, 8]
    events: list[tuple] = [("refresh", list(rows))]
    for t in range(steps):
        if t == 5:  # preemption: rows 1 and 2 re-admitted in blocks 9 and 10, recomputed
            rows[1], rows[2] = 9, 10
            events.append(("refresh", [9, 10]))
        if t == 11:  # vLLM condenses its persistent batch: rows move
            rows = rows[3:] + rows[:3]
        events.append(("decode", list(rows)))
    return events


def flush_moves_by_tma(shape: ModelShape, cfg, cache, device: torch.device) -> bool:
    """Whether this batch's persistent flush moves the page's checkpoint through TMA (the
    kernels' default where the layout allows it)."""
    from replayssm_quant.kernels.plan import step_plan

    if cfg.L == 1:
        return False
    plan = step_plan(shape, cfg, ROWS, device, ckpt_data=cache.ckpt.data)
    return plan.flush is not None and plan.flush.tma


DEFAULT_SHAPES = {"mamba2": "nemotron-3-super-120b", "gdn": "qwen3.5-4b"}


def check_one(kind: str, preset: str, device: torch.device, steps: int, tiny: bool,
              seed: int, L: int | None = None, shape_name: str | None = None) -> Result:
    res = Result(kind, preset)
    t0 = time.time()
    shape = TINY[kind] if tiny else SHAPES[shape_name or DEFAULT_SHAPES[kind]]
    cfg = PRESETS[preset]
    if L is not None and cfg.L > 1:
        cfg = with_buffer_len(cfg, L)
    layer = Layer(shape, cfg, device, seed)
    graph_cache, eager_cache = layer.caches
    use_graph = device.type == "cuda"
    res.tma = flush_moves_by_tma(shape, cfg, graph_cache, device)

    def captured():
        return layer.run(graph_cache, layer.static)

    if use_graph:  # warm up (compiles) and capture with padding rows only: nothing is written
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                captured()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y_static, _ = captured()
        torch.cuda.synchronize()
    null_page = layer.pages[0][0].clone()
    for event, slots in schedule(steps):
        if event == "refresh":
            res.refresh_exact &= layer.refresh(slots)
            continue
        inp = layer._new_inputs(slots)
        layer.sync_reference()
        before = graph_cache.cursor[slots].clone()
        layer.load(inp)
        if use_graph:
            graph.replay()
            y = y_static
        else:
            y, _ = captured()
        y_eager, _ = layer.run(eager_cache, inp)
        y_ref = layer.reference_step(inp)
        res.steps += 1
        res.flushes += int((before == layer.cfg.L - 1).sum()) if layer.cfg.L > 1 else REAL
        scale = max(y_ref[:REAL].abs().max().item(), 1e-6)
        res.out_err = max(res.out_err, (y[:REAL] - y_ref[:REAL]).abs().max().item() / scale)
        res.graph_eq_eager &= bool(torch.equal(y, y_eager))
        res.graph_eq_eager &= bool(torch.equal(layer.pages[0], layer.pages[1]))
        res.counters_ok &= bool(torch.equal(graph_cache.cursor, eager_cache.cursor))
        res.counters_ok &= bool(torch.equal(graph_cache.flush_index[slots].long(),
                                            layer.ref.flush_index[slots]))
        res.counters_ok &= bool(torch.equal(graph_cache.cursor[slots].long(),
                                            layer.ref.cursor[slots]))
        res.counters_ok &= bool((y[REAL:] == 0).all())
        res.state_diff = max(res.state_diff, layer.state_mismatch(slots))
        res.null_untouched &= bool(torch.equal(layer.pages[0][0], null_page))
        res.null_untouched &= graph_cache.cursor[0].item() == 0
    if device.type == "cuda":
        torch.cuda.synchronize()
    res.seconds = time.time() - t0
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=24, help="decode steps per preset")
    ap.add_argument("--quick", action="store_true", help="three presets only")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (interpreter dry run)")
    ap.add_argument("--presets", nargs="*", default=None)
    ap.add_argument("--L", type=int, default=None,
                    help="flush interval for the replaying presets (default: theirs, 16)")
    ap.add_argument("--mamba2-shape", default=DEFAULT_SHAPES["mamba2"],
                    choices=[n for n, sh in SHAPES.items() if sh.kind == "mamba2"],
                    help="paper shape of the Mamba-2 layer (Nemotron-3-Nano-4B's head dim of 80 "
                         "runs whole-head programs in two row passes)")
    ap.add_argument("--gdn-shape", default=DEFAULT_SHAPES["gdn"],
                    choices=[n for n, sh in SHAPES.items() if sh.kind == "gdn"],
                    help="paper shape of the GDN layer")
    ap.add_argument("--kinds", nargs="+", default=["mamba2", "gdn"], choices=["mamba2", "gdn"],
                    help="layer types to check")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    shape_of = {"mamba2": args.mamba2_shape, "gdn": args.gdn_shape}
    presets = args.presets or (["nvfp4-read/fp16-sr", "shared-fp8", "fp16-sr"] if args.quick
                               else list(PRESETS))
    t0 = time.time()
    if device.type == "cuda":
        print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    results = []
    for kind in args.kinds:
        if not args.tiny:
            print(f"{kind}: {shape_of[kind]}")
        for i, preset in enumerate(presets):
            try:
                r = check_one(kind, preset, device, args.steps, args.tiny, seed=100 + i,
                              L=args.L, shape_name=shape_of[kind])
            except Exception as e:  # report and carry on: one table for everything
                r = Result(kind, preset, error=f"{type(e).__name__}: {e}")
            results.append(r)
            print(f"  {kind:6s} {preset:20s} {'ok' if r.ok else 'FAIL'} ({r.seconds:.1f} s)",
                  flush=True)
    head = (f"{'layer':6s} {'preset':20s} {'steps':>5s} {'flush':>5s} {'out err':>9s} "
            f"{'state diff':>10s} {'graph=eager':>11s} {'null blk':>8s} {'counters':>8s} "
            f"{'refresh':>7s} {'tma':>5s} {'result':>6s}")
    print("\n" + head + "\n" + "-" * len(head))
    for r in results:
        print(f"{r.kind:6s} {r.preset:20s} {r.steps:5d} {r.flushes:5d} {r.out_err:9.2e} "
              f"{r.state_diff:10.2%} {str(r.graph_eq_eager):>11s} {str(r.null_untouched):>8s} "
              f"{str(r.counters_ok):>8s} {str(r.refresh_exact):>7s} {str(r.tma):>5s} "
              f"{'ok' if r.ok else 'FAIL':>6s}")
        if r.error:
            print(f"    {r.error}")
    bad = [r for r in results if not r.ok]
    print(f"\n{len(results) - len(bad)}/{len(results)} passed in {time.time() - t0:.0f} s "
          f"(out err: max |y - y_ref| / max |y_ref| per step; state diff: stored elements off "
          f"by one rounding step)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
