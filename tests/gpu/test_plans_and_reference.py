"""The launch plans this GPU resolves match the named target's (a named target is only useful
if it plans what that GPU runs), and every preset's kernels match the pure-torch reference at
the paper shapes, step by step from the same state with rows flushing on different steps, into
an output buffer poisoned with NaN so an element the kernel leaves unwritten shows; with one
NaN in the stored state the outputs are NaN exactly where the reference's are. Tolerances are
those ``python -m benchmarks.tune_decode --check-only`` reports against (output relative error
<= 1e-6 for every preset, checkpoint elements apart <= 2% for narrow formats)."""

from __future__ import annotations

import itertools

import pytest
import torch

from replayssm_quant.precision import PRESETS, SHAPES
from tests.gpu.conftest import needs_gpu

pytestmark = [pytest.mark.gpu, needs_gpu]

TARGET = "h200"
BATCHES = (1, 4, 16, 64, 256, 512)


def _comparable(plan) -> dict:
    d = plan.to_dict()
    d.pop("target")
    for ln in d["launches"]:  # the persistent grid names the SM count
        ln.pop("grid")
        ln.pop("programs")
    return d


def test_plans_on_this_gpu_match_the_named_target():
    from replayssm_quant.kernels.plan import step_plan

    if "H200" not in torch.cuda.get_device_name():
        pytest.skip(f"the {TARGET} target describes an H200")
    differ = [(s, c, b) for s, c, b in itertools.product(SHAPES, PRESETS, BATCHES)
              if _comparable(step_plan(s, c, b, "cuda")) != _comparable(step_plan(s, c, b, TARGET))]
    assert not differ


@pytest.mark.parametrize("nan_state", [False, True], ids=["finite", "nan-state"])
@pytest.mark.parametrize("preset", list(PRESETS))
@pytest.mark.parametrize("shape", list(SHAPES))
def test_kernels_match_the_reference(shape, preset, nan_state):
    from benchmarks.tune_decode import check_preset

    r = check_preset(SHAPES[shape], PRESETS[preset], batch=4, nan_state=nan_state)
    assert r["nan_ok"]
    assert r["y_rel"] <= 1e-6
    assert r["ckpt_differ"] <= 2e-2 and r["read_differ"] <= 2e-2
