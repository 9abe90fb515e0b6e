"""NaN inputs at the paper shapes: a decode step whose inputs hold NaNs reports exactly the
NaNs it writes to the checkpoint (``cache.nan_count``), and a finite step none. ReplaySSM
presets are checked on their flush step (every row's cursor at L-1), where the new
checkpoint is written; conventional presets on their one step."""

from __future__ import annotations

import pytest
import torch

from replayssm_quant.precision import PRESETS, SHAPES
from tests.gpu.conftest import needs_gpu

pytestmark = [pytest.mark.gpu, needs_gpu]

CONFIGS = ("replay-fp32", "nvfp4-read/fp16-sr", "fp32", "fp16-sr")
BATCH = 256


def count_pair(w, planted: bool) -> tuple[int, int]:
    """(NaNs in the checkpoint after one step, NaNs the step reported), with NaNs planted in
    two rows' inputs (a whole head of one row, part of a head of another) when ``planted``."""
    cfg, cache = w.cfg, w.cache
    if cfg.L > 1:
        cache.cursor.fill_(cfg.L - 1)
    cache.nan_count.zero_()
    key = "x" if w.shape.kind == "mamba2" else "v"
    a = w.inputs[0]
    saved = a[key].clone()
    if planted:
        a[key][min(3, w.batch - 1), w.shape.heads - 1] = float("nan")
        a[key][w.batch // 2, 0, :7] = float("nan")
    w.step(0, advance=False)
    a[key].copy_(saved)
    torch.cuda.synchronize()
    return int(torch.isnan(cache.ckpt.data.float()).sum()), int(cache.nan_count.sum())


@pytest.mark.parametrize("preset", CONFIGS)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_step_reports_the_nans_it_writes(shape, preset):
    from benchmarks.decode import Workload

    w = Workload(SHAPES[shape], BATCH, PRESETS[preset], steps=1, device="cuda")
    assert count_pair(w, planted=False) == (0, 0)
    written, reported = count_pair(w, planted=True)
    assert written == reported > 0
