"""The decoded read source kept between checkpoint writes changes no number: decode steps,
verify/commit and the model decoder give bit-identical outputs and states with and without it,
and every checkpoint write (flush, load, commit) makes the next read decode the new copy."""

from __future__ import annotations

import pytest
import torch

from replayssm_quant.formats import dequantize
from replayssm_quant.models import decode as decode_mod
from replayssm_quant.models.decode import ReplayDecoder
from replayssm_quant.models.tiny import tiny_model
from replayssm_quant.ssm import gdn, init_gdn_state, init_mamba2_state, load_state, mamba2
from replayssm_quant.ssm.replay import enable_read_cache, read_source, select_slots
from replayssm_quant.ssm.synthetic import gdn_inputs, mamba2_inputs

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SLOTS, STEPS = 4, 19
CONFIGS = ("ckpt=fp16:sr,read=nvfp4,L=4", "ckpt=fp32,read=fp8e4m3,L=3",
           "ckpt=bf16:sr,read=none,L=4")


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Bit patterns, so -0.0 and NaN payloads count too."""
    return t.contiguous().view(torch.int32)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(_bits(a), _bits(b))


def _source(st):
    return st.read if st.read is not None else st.ckpt


class _Kind:
    def __init__(self, mod, init, dims, make_inputs):
        self.mod, self.init, self.dims, self.make_inputs = mod, init, dims, make_inputs

    def state(self, cfg: str, cached: bool):
        st = self.init(cfg, SLOTS, *self.dims, seed=7, layer=1, spec_tokens=2)
        if cached:
            enable_read_cache(st)
        S0 = torch.randn(st.state_shape, generator=torch.Generator().manual_seed(3))
        load_state(st, torch.arange(SLOTS), S0)
        return st

    def step(self, st, inp, t, slots):
        sel = slots.clamp(min=0)
        if self.mod is mamba2:
            return mamba2.decode_step(st, inp["x"][sel, t], inp["dt"][sel, t], inp["A"],
                                      inp["Bm"][sel, t], inp["C"][sel, t], inp["D"], slots)
        return gdn.decode_step(st, *(inp[n][sel, t] for n in ("q", "k", "v", "g", "beta")),
                               slots)

    def verify_commit(self, st, inp, t, slots, accepted):
        T = 2
        if self.mod is mamba2:
            y = mamba2.verify(st, inp["x"][slots, t:t + T], inp["dt"][slots, t:t + T], inp["A"],
                              inp["Bm"][slots, t:t + T], inp["C"][slots, t:t + T], inp["D"],
                              slots)
            mamba2.commit(st, accepted, slots, inp["A"])
            return y
        y = gdn.verify(st, *(inp[n][slots, t:t + T] for n in ("q", "k", "v", "g", "beta")),
                       slots)
        gdn.commit(st, accepted, slots)
        return y


KINDS = {
    "mamba2": _Kind(mamba2, init_mamba2_state, (4, 8, 32, 2),
                    lambda g: mamba2_inputs(SLOTS, STEPS + 2, 4, 8, 32, 2, generator=g)),
    "gdn": _Kind(gdn, init_gdn_state, (4, 16, 32, 2),
                 lambda g: gdn_inputs(SLOTS, STEPS + 2, 4, 16, 32, 2, generator=g)),
}


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_cached_reads_are_bit_identical(kind, cfg):
    """Several windows, rows flushing at different steps (a padding row and a left-out slot
    shift their cursors), a verify/commit across a flush: same outputs, same stored state, and
    the cache always holds what decoding the stored copy gives."""
    k = KINDS[kind]
    inp = k.make_inputs(torch.Generator().manual_seed(11))
    plain, cached = k.state(cfg, False), k.state(cfg, True)
    assert plain.read_cache is None
    assert (cached.read_cache is None) == (_source(cached).fmt.name == "fp32")
    flushed = 0
    for t in range(STEPS):
        slots = torch.tensor([0, 1, 2, 3]) if t % 5 else torch.tensor([2, -1, 0])
        before = cached.flush_index.clone()
        outs = [k.step(st, inp, t, slots) for st in (plain, cached)]
        assert _same(*outs), t
        flushed += int((cached.flush_index != before).sum())
        if cached.read_cache is not None:
            every = torch.arange(SLOTS)
            assert _same(read_source(cached, every), dequantize(_source(cached)))
            assert bool(cached.read_cache.fresh.all())
    assert flushed >= 6  # several windows, not one
    accepted = torch.tensor([2, 1, 0, 2])
    ys = [k.verify_commit(st, inp, STEPS, torch.arange(SLOTS), accepted)
          for st in (plain, cached)]
    assert _same(*ys)
    if cached.read_cache is not None:
        assert _same(read_source(cached, torch.arange(SLOTS)), dequantize(_source(cached)))
    for name in ("data", "row_scale", "block_scale"):
        a, b = getattr(_source(plain), name), getattr(_source(cached), name)
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name
    assert torch.equal(plain.cursor, cached.cursor)
    assert torch.equal(plain.flush_index, cached.flush_index)


def test_a_checkpoint_write_invalidates_only_its_slots():
    k = KINDS["mamba2"]
    inp = k.make_inputs(torch.Generator().manual_seed(5))
    st = k.state("ckpt=fp16:sr,read=nvfp4,L=4", True)
    cache = st.read_cache
    every = torch.arange(SLOTS)
    assert not bool(cache.fresh.any())  # nothing decoded before the first read
    first = read_source(st, every).clone()
    assert bool(cache.fresh.all())
    for t in range(2):
        k.step(st, inp, t, every)  # non-flush steps: the copy and the cache stay
        assert bool(cache.fresh.all())
        assert _same(read_source(st, every), first)
    load_state(st, torch.tensor([1]), torch.randn(1, *st.state_shape[1:]))
    assert cache.fresh.tolist() == [True, False, True, True]
    now = read_source(st, every)
    assert _same(now, dequantize(_source(st)))
    assert not _same(now[1], first[1]) and _same(now[[0, 2, 3]], first[[0, 2, 3]])
    k.step(st, inp, 2, torch.tensor([0, 2, 3]))  # slots 0, 2, 3 reach L-1 and flush
    k.step(st, inp, 3, torch.tensor([0, 2, 3]))
    assert cache.fresh.tolist() == [False, True, False, False]
    assert _same(read_source(st, every), dequantize(_source(st)))


def test_a_replaced_read_copy_is_decoded_again():
    st = KINDS["gdn"].state("ckpt=fp32,read=nvfp4,L=4", True)
    every = torch.arange(SLOTS)
    read_source(st, every)
    other = KINDS["gdn"].state("ckpt=fp32,read=nvfp4,L=4", False)
    other.read.data.copy_(torch.flip(other.read.data, (0,)))
    st.read = select_slots(other.read, every)
    assert _same(read_source(st, every), dequantize(st.read))


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5_text"])
def test_decoder_gives_the_same_numbers_with_the_cache(model_type, monkeypatch):
    """The model decoder (reference backend) with and without the cache: same log-likelihoods
    and tokens, over several flushes."""
    model, _ = tiny_model(model_type)
    prompts = [[5, 9, 14, 3, 7], [8, 2, 11]]
    conts = [list(range(20, 31)), list(range(40, 49))]
    cfg = "ckpt=fp16:sr,read=nvfp4,L=4"

    def run():
        dec = ReplayDecoder(model, cfg, seed=2, backend="reference")
        gens = dec.generate(prompts, max_new_tokens=10)
        return [g.tokens for g in gens], dec.score(prompts, conts)

    cached = run()
    monkeypatch.setattr(decode_mod, "enable_read_cache", lambda state: None)
    plain = run()
    assert cached[0] == plain[0]
    assert [float(x).hex() for x, _ in cached[1]] == [float(x).hex() for x, _ in plain[1]]
