"""Decode steps whose kernels first run inside a CUDA-graph capture. The persistent flush
sizes its grid from the compiled kernel (compiled, loaded and asked for its occupancy during
the capture when the capture is the first call), and nothing in the default step may copy
from host memory. Each case captures a non-flush step and a flush step, replays them once,
and compares outputs and checkpoint bit for bit with the same two steps run eagerly on a copy
of the cache: first as the first call of that specialization, then at a batch size the eager
warm-up did not use (a new persistent-grid key)."""

from __future__ import annotations

import copy

import pytest
import torch

from replayssm_quant.precision import PRESETS, SHAPES
from tests.gpu.conftest import needs_gpu

pytestmark = [pytest.mark.gpu, needs_gpu]

CASES = [("nemotron-3-super-120b", "nvfp4-read/fp16-sr"), ("qwen3.5-4b", "replay-fp32"),
         ("nemotron-3-nano-4b", "shared-nvfp4"), ("qwen3.5-122b-a10b", "nvfp4-read/fp32")]
BATCH, OTHER_BATCH = 48, 40  # 40: not a multiple of 16, so a new persistent-grid key


def captured_and_eager(sname: str, cname: str, batch: int, warm_batch: int | None):
    """Two steps (non-flush, flush) at ``batch`` captured after eager steps at ``warm_batch``
    (None: none) and replayed, and the same two steps run eagerly on a copy of the cache."""
    from benchmarks.decode import Workload

    cfg = PRESETS[cname]
    if warm_batch:
        warm = Workload(SHAPES[sname], warm_batch, cfg, steps=cfg.L, device="cuda")
        for i in range(cfg.L):
            warm.step(i)
        torch.cuda.synchronize()
    w = Workload(SHAPES[sname], batch, cfg, steps=cfg.L, device="cuda")
    w.cache.cursor.fill_(cfg.L - 2)
    eager_cache = copy.deepcopy(w.cache)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=torch.cuda.Stream()):
        outs = [w.step(cfg.L - 2), w.step(cfg.L - 1)]
    g.replay()
    torch.cuda.synchronize()
    w.cache, captured_cache = eager_cache, w.cache
    eager = [w.step(cfg.L - 2), w.step(cfg.L - 1)]
    torch.cuda.synchronize()
    return (outs, captured_cache), (eager, eager_cache)


@pytest.mark.parametrize("sname,cname", CASES)
def test_replay_equals_eager(sname, cname):
    for batch, warm in ((BATCH, None), (OTHER_BATCH, BATCH)):
        (outs, cap), (eager, ref) = captured_and_eager(sname, cname, batch, warm)
        for a, b in zip(outs, eager, strict=True):
            assert torch.equal(a, b), (batch, warm)
        assert torch.equal(cap.ckpt.data, ref.ckpt.data), (batch, warm)
