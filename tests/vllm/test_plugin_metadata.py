"""Cursor and flush flags across prefill, decode, flush and preemption.

Mamba-2: vLLM's metadata builder computes ``write_pos``/``is_flush`` on the CPU from sequence
lengths; the plugin's kernels keep the cursor on the device. Both must agree on every decode
step (prefill zeroes the cursor, a flush wraps it, a preempted request restarts from its new
prefill). GDN has no such builder fields: the device cursor alone drives the flushes. In every
case the layer's outputs equal vLLM's stock FP32 layer (``replay-fp32`` is exact ReplaySSM).
"""

import pytest

pytest.importorskip("vllm")

import harness as H  # noqa: E402
import torch  # noqa: E402

L = 4


@pytest.fixture(scope="module")
def mamba_pair(monkeypatch_module):
    H.install_cpu_standins(monkeypatch_module)
    plugin = H.Rig("mamba2", "replay-fp32", L=L)
    stock = H.Rig("mamba2", None, weights_from=plugin)
    return plugin, stock


@pytest.fixture(scope="module")
def gdn_pair(monkeypatch_module):
    H.install_cpu_standins(monkeypatch_module)
    plugin = H.Rig("gdn", "replay-fp32", L=L)
    stock = H.Rig("gdn", None, weights_from=plugin)
    return plugin, stock


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def _same(a, b):
    scale = max(b.abs().max().item(), 1e-6)
    assert (a - b).abs().max().item() <= 2e-5 * scale


class Scenario:
    """Requests as (block, num_computed, query_len, decode_base, is_prefilling) rows."""

    def __init__(self, plugin, stock, seed=0):
        self.plugin, self.stock = plugin, stock
        self.g = torch.Generator().manual_seed(seed)
        self.cache = plugin.layer.replayssm_cache

    def run(self, reqs):
        tokens = sum(r[2] for r in reqs)
        inputs = self.plugin.inputs(tokens, self.g)
        blocks = [r[0] for r in reqs]
        before = self.cache.cursor[blocks].clone()
        fi_before = self.cache.flush_index[blocks].clone()
        out, md = self.plugin.step(reqs, inputs)
        ref, _ = self.stock.step(reqs, inputs)
        _same(out, ref)
        return md, before, fi_before


def test_mamba2_builder_and_device_cursor_agree(mamba_pair):
    plugin, stock = mamba_pair
    s = Scenario(plugin, stock)
    cur, fi = s.cache.cursor, s.cache.flush_index
    # prefill two requests; the refresh zeroes their cursors
    cur[[3, 1]] = 7
    s.run([(3, 0, 10, 10, True), (1, 0, 7, 7, True)])
    assert cur[[3, 1]].tolist() == [0, 0] and fi[[3, 1]].tolist() == [0, 0]
    n = {3: 10, 1: 7}
    flushes = 0
    for _ in range(L + 2):
        md, before, fi_before = s.run([(3, n[3], 1, 10, False), (1, n[1], 1, 7, False)])
        assert md.write_pos_d.tolist() == before.tolist()
        assert md.is_flush_d.tolist() == (before == L - 1).int().tolist()
        assert cur[[3, 1]].tolist() == ((before + 1) % L).tolist()
        assert fi[[3, 1]].tolist() == (fi_before + (before == L - 1).int()).tolist()
        flushes += int(md.is_flush_d.sum())
        n = {k: v + 1 for k, v in n.items()}
    assert flushes == 2
    # preemption: request 1 is re-admitted in block 5 and recomputed (prompt + 6 outputs)
    resumed = 7 + L + 2
    md, _, _ = s.run([(3, n[3], 1, 10, False), (5, 0, resumed, resumed, True)])
    assert cur[5].item() == 0 and fi[5].item() == 0
    n, base = {3: n[3] + 1, 5: resumed}, {3: 10, 5: resumed}
    for _ in range(L + 1):
        md, before, _ = s.run([(b, n[b], 1, base[b], False) for b in (3, 5)])
        assert md.write_pos_d.tolist() == before.tolist()
        assert md.is_flush_d.tolist() == (before == L - 1).int().tolist()
        n = {k: v + 1 for k, v in n.items()}


def test_mamba2_one_token_prompt_tail(mamba_pair):
    """A last prefill chunk of one token runs on the decode path. vLLM's builder schedules it
    as a one-token flush; the plugin's cursor simply records it (the checkpoint is the exact
    state of the first chunk), so the plugin's flushes run one step earlier for that request.
    Both are exact; the outputs match the stock layer throughout."""
    plugin, stock = mamba_pair
    s = Scenario(plugin, stock, seed=1)
    cur = s.cache.cursor
    s.run([(2, 0, 5, 6, True)])
    md, before, _ = s.run([(2, 5, 1, 6, True)])
    assert md.num_prefills == 0 and md.num_decodes == 1
    assert md.write_pos_d.tolist() == [0] and md.is_flush_d.tolist() == [1]
    assert before.tolist() == [0] and cur[2].item() == 1
    for step in range(L + 1):
        md, before, _ = s.run([(2, 6 + step, 1, 6, False)])
        assert before.item() == (md.write_pos_d.item() + 1) % L


def test_gdn_device_cursor(gdn_pair):
    plugin, stock = gdn_pair
    s = Scenario(plugin, stock)
    cur, fi = s.cache.cursor, s.cache.flush_index
    cur[[3, 1]] = 5
    s.run([(3, 0, 9, 9, True), (1, 0, 6, 6, True)])
    assert cur[[3, 1]].tolist() == [0, 0] and fi[[3, 1]].tolist() == [0, 0]
    n = {3: 9, 1: 6}
    for step in range(L + 2):
        _, before, fi_before = s.run([(3, n[3], 1, 9, False), (1, n[1], 1, 6, False)])
        assert before.tolist() == [step % L] * 2
        assert fi[[3, 1]].tolist() == (fi_before + (before == L - 1).int()).tolist()
        n = {k: v + 1 for k, v in n.items()}
    # preemption of request 1 (re-prefilled in block 6) next to a decode (mixed batch)
    s.run([(3, n[3], 1, 9, False), (6, 0, 12, 12, True)])
    assert cur[6].item() == 0 and cur[3].item() == (L + 3) % L
    # a one-token prompt tail with prior state runs on the decode path: recorded in the ring
    s.run([(3, n[3] + 1, 1, 9, False), (6, 12, 1, 13, True)])
    assert cur[6].item() == 1
    for _ in range(L):
        s.run([(6, 13 + _, 1, 13, False)])
    assert cur[6].item() == 1


@pytest.mark.parametrize("pair", ["mamba_pair", "gdn_pair"])
def test_one_token_chunk_inside_a_prompt(pair, request):
    """Chunked prefill can give a request a single token that is not its last: vLLM runs it on
    the decode path (the kernels append a ring record), then the next chunk is a prefill that
    continues from checkpoint + that record, and decode continues exactly."""
    plugin, stock = request.getfixturevalue(pair)
    s = Scenario(plugin, stock, seed=2)
    s.run([(4, 0, 5, 11, True)])
    s.run([(4, 5, 1, 11, True)])
    assert s.cache.cursor[4].item() == 1
    s.run([(4, 6, 5, 11, True)])
    assert s.cache.cursor[4].item() == 0
    for step in range(L + 1):
        s.run([(4, 11 + step, 1, 11, False)])
