"""The ``replayssm`` lm-eval backend and the ReplaySSM decoder behind it.

The decoder must be the model's own decoding when the config is conventional FP32 (greedy tokens
equal to ``generate()``, divergence only at a numerical near-tie), must route every SSM layer's
state through the replay state otherwise, and must report how each generation ended.
"""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

from replayssm_quant.models.decode import STEP_FUNCTIONS, ReplayDecoder
from replayssm_quant.models.fixture import FIXTURES, fixture_path
from replayssm_quant.models.tiny import tiny_model

NEAR_TIE = 1e-4
GEN_TOKENS = 256
PROMPT = ("KING RICHARD. Now is the winter of our discontent\nMade glorious summer by this sun of "
          "York;\n")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _has_fixture(name: str) -> bool:
    try:
        fixture_path(name)
    except (FileNotFoundError, KeyError):
        return False
    return True


def _load(name: str):
    """A fixture model, or a tiny random model of the same class until the fixtures exist."""
    from replayssm_quant.models.fixture import fixture

    if _has_fixture(name):
        return fixture(name)
    return tiny_model({"nemotron-h-tiny": "nemotron_h", "qwen3.5-tiny": "qwen3_5_text"}[name])


@pytest.fixture(scope="module", params=FIXTURES)
def model_tok(request):
    return _load(request.param)


def _hf_greedy(model, prompt: list[int], n: int):
    """``generate()`` of the unpatched model (EOS disabled so it runs ``n`` tokens) with the
    logits of every step."""
    from transformers import GenerationConfig

    gc = GenerationConfig(max_new_tokens=n, min_new_tokens=0, do_sample=False, eos_token_id=None,
                          bos_token_id=None, pad_token_id=0, output_scores=True,
                          return_dict_in_generate=True)
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), generation_config=gc)
    return out.sequences[0, len(prompt):].tolist(), [s[0].float() for s in out.scores]


def test_fp32_greedy_equals_generate(model_tok):
    """>= 256 greedy tokens of the fp32 decoder equal the unpatched model's generate(); a
    divergence is accepted only where generate's top-2 logits are within 1e-4 and the decoder
    took the runner-up, after which both continue from the common prefix."""
    model, tok = model_tok
    prompt = tok(PROMPT)["input_ids"]
    dec = ReplayDecoder(model, "fp32")
    compared, ties, prefix = 0, 0, []
    while compared < GEN_TOKENS:
        want = GEN_TOKENS - compared
        ref, scores = _hf_greedy(model, prompt + prefix, want)
        got = dec.generate([prompt + prefix], max_new_tokens=want, tokenizer=tok)[0]
        assert got.finish == "length" and len(got.tokens) == want
        diff = next((i for i, (a, b) in enumerate(zip(ref, got.tokens, strict=True)) if a != b),
                    None)
        if diff is None:
            compared += want
            break
        top2 = torch.topk(scores[diff], 2)
        gap = float(top2.values[0] - top2.values[1])
        assert gap < NEAR_TIE, f"divergence at token {compared + diff} with top-2 gap {gap:.2e}"
        assert got.tokens[diff] in top2.indices.tolist()
        ties += 1
        assert ties <= 3, "too many near-tie divergences"
        prefix += ref[:diff + 1]
        compared += diff + 1
    assert compared >= GEN_TOKENS
    if ties or tok.eos_token_id in ref:
        return
    # the same through the lm-eval backend's generate_until (text, and a full-length log)
    from replayssm_quant.evals.lm_backend import ReplaySSMLM

    lm = ReplaySSMLM(pretrained=model, tokenizer=tok, config="fp32")
    text = lm.generate_until([_Req(PROMPT, {"until": [], "max_gen_toks": GEN_TOKENS,
                                            "do_sample": False})])[0]
    assert text == tok.decode(ref, skip_special_tokens=False)
    assert lm.generation_log[0]["gen_tokens"] == GEN_TOKENS
    assert lm.generation_log[0]["truncated"] is True


def test_hooks_route_state_and_restore(model_tok):
    """A narrow shared state changes the scores (the replay state is really used), and the
    patched step function is restored afterwards."""
    model, tok = model_tok
    from replayssm_quant.models.registry import architecture

    arch = architecture(model)
    mod = importlib.import_module(arch.module)
    fn = STEP_FUNCTIONS[arch.kind]
    original = getattr(mod, fn)
    ids = tok(PROMPT * 2)["input_ids"]
    ctx, cont = ids[:12], ids[12:60]
    base = ReplayDecoder(model, "fp32", clamp_dt=True).score([ctx], [cont])[0][0]
    narrow = ReplayDecoder(model, "ckpt=nvfp4,read=none,L=4", clamp_dt=True).score(
        [ctx], [cont])[0][0]
    assert getattr(mod, fn) is original
    assert narrow != base
    # teacher-forced fp32 decode (dt clamped as the forward does) = the model's own full
    # forward, to float32 rounding
    with torch.inference_mode():
        lp = F.log_softmax(model(torch.tensor([ids[:60]]), use_cache=False).logits.float(), -1)[0]
    full = sum(float(lp[11 + j, t]) for j, t in enumerate(cont))
    assert base == pytest.approx(full, rel=1e-5, abs=1e-4)


def test_decode_path_agrees_with_teacher_forced_emulation(model_tok):
    """Two independent routes to a config's numerics: this decoder (HF cache, one decode step per
    token) and the adapters' whole-sequence emulation (chunked prefill, then the config's decode
    emulation) score a continuation alike over several flush windows.

    Only configs whose rounding does not feed back into the recurrence are compared: the two
    routes compute the SSM inputs in a different order (cached vs whole-sequence convolution),
    and a one-ulp input difference can flip a narrow checkpoint's rounding decision, which then
    persists in the state. Mamba-2's dt is clamped to ``time_step_limit`` as the forward (and
    the emulation) does; ``generate()`` does not clamp, and the fixture has dt below it."""
    from replayssm_quant.models.patch import patch_model

    model, tok = model_tok
    ids = tok(PROMPT * 3)["input_ids"][:72]
    P = 20
    for cfg in ("nvfp4-read/fp32", "ckpt=fp32,read=fp8,L=8"):
        got = ReplayDecoder(model, cfg, seed=3, clamp_dt=True).score([ids[:P]], [ids[P:]])[0][0]
        with torch.inference_mode(), patch_model(model, cfg, prefill=P, seed=3):
            lp = F.log_softmax(model(torch.tensor([ids]), use_cache=False).logits.float(), -1)[0]
        want = sum(float(lp[P - 1 + j, t]) for j, t in enumerate(ids[P:]))
        assert got == pytest.approx(want, rel=1e-6, abs=1e-4), cfg


def test_batched_generation_matches_single():
    """Left-padded batches decode each row as if alone (SSM inputs at padding are masked)."""
    model, tok = _load("qwen3.5-tiny")
    texts = ["ROMEO. But soft, what light", "HAMLET. To be, or not to be, that is the question: "
             "Whether 'tis nobler in the mind", "KING. Now"]
    prompts = [tok(t)["input_ids"] for t in texts]
    dec = ReplayDecoder(model, "nvfp4-read/fp32")
    batch = dec.generate(prompts, max_new_tokens=40, tokenizer=tok, stop=["\n\n"])
    for p, b in zip(prompts, batch, strict=True):
        single = dec.generate([p], max_new_tokens=40, tokenizer=tok, stop=["\n\n"])[0]
        assert b.tokens == single.tokens and b.finish == single.finish and b.text == single.text


def test_finish_reasons_stop_eos_length():
    model, tok = tiny_model("nemotron_h")
    dec = ReplayDecoder(model, "fp32")
    p = tok("Hello there")["input_ids"]
    forced = tok(" answer STOP more")["input_ids"]
    g = dec.generate([p, p, p], max_new_tokens=12, tokenizer=tok, stop=["STOP"],
                     eos_token_ids=[forced[2]],
                     forced=[forced, forced[:1] + forced[1:2] * 20, None])
    assert g[0].finish == "eos" and g[0].tokens == forced[:3]
    assert g[1].finish == "length" and g[1].truncated and len(g[1].tokens) == 12
    g = dec.generate([p], max_new_tokens=30, tokenizer=tok, stop=["STOP"], forced=[forced])[0]
    assert g.finish == "stop" and g.stop == "STOP" and g.text == " answer "
    assert not g.truncated
    # a stop string completed by the very last allowed token is a finished answer
    g = dec.generate([p], max_new_tokens=len(tok(" answer STOP")["input_ids"]), tokenizer=tok,
                     stop=["STOP"], forced=[forced])[0]
    assert g.finish == "stop" and not g.truncated


def test_triton_kernels_match_reference_path():
    """The CUDA path (Triton kernels on the same state tensors; interpreted here) decodes like
    the reference, flushes and stochastic rounding included."""
    for kind in ("nemotron_h", "qwen3_5_text"):
        model, tok = tiny_model(kind)
        ctx = tok("To be, or not to be")["input_ids"]
        cont = tok(" that is the question")["input_ids"][:6]
        for cfg in ("fp32", "ckpt=fp16:sr,read=nvfp4,L=2"):
            ref = ReplayDecoder(model, cfg, backend="reference").score([ctx], [cont])[0][0]
            ker = ReplayDecoder(model, cfg, backend="triton").score([ctx], [cont])[0][0]
            assert ker == pytest.approx(ref, rel=1e-5, abs=1e-4), (kind, cfg)


# ----------------------------------------------------------------------------- lm-eval
class _Req:
    def __init__(self, *args):
        self.args = args


def test_registry_and_lm_interface():
    import lm_eval.api.registry as reg

    import replayssm_quant.evals.lm_backend as backend

    assert reg.get_model("replayssm") is backend.ReplaySSMLM
    assert reg.get_model("hf").__name__ == "HFLM"  # our registration keeps lm-eval's own
    lm = reg.get_model("replayssm").create_from_arg_string(
        "pretrained=random:qwen3_5_text,config=ckpt=fp32;read=nvfp4;L=4,seed=3,batch_size=2",
        {"batch_size": None, "device": "cpu"})
    assert str(lm.cfg) == "ckpt=fp32,read=nvfp4,L=4" and lm.seed == 3 and lm.batch_size == 2
    reqs = [_Req("Hello", {"until": ["\n"], "max_gen_toks": 5, "do_sample": False}),
            _Req("A much longer prompt here", {"until": ["zz"], "max_gen_toks": 3}),
            _Req("Hi", {"until": ["\n"], "max_gen_toks": 5, "do_sample": False})]
    out = lm.generate_until(reqs)
    assert len(out) == 3 and all(isinstance(o, str) for o in out)
    assert len(lm.generation_log) == 3
    assert {e["max_gen_toks"] for e in lm.generation_log} == {3, 5}
    by_hash = {e["prompt_hash"]: e for e in lm.generation_log}
    from lm_eval.utils import hash_string

    entry = by_hash[hash_string("A much longer prompt here")]
    assert entry["gen_tokens"] <= 3 and entry["finish"] in ("length", "stop", "eos")
    # no max_gen_toks in the request: the backend's own limit (32768 by default), never
    # lm-eval's silent 256
    assert backend.DEFAULT_MAX_GEN_TOKS == lm.max_gen_toks == 32768
    lm.max_gen_toks = 4
    lm.generate_until([_Req("Hey", {"until": ["zz"]})])
    assert lm.generation_log[-1]["max_gen_toks"] == 4


def test_loglikelihood_matches_forward():
    from replayssm_quant.evals.lm_backend import ReplaySSMLM

    model, tok = tiny_model("nemotron_h")
    lm = ReplaySSMLM(pretrained=model, tokenizer=tok, config="fp32", batch_size=2)
    reqs = [_Req("The cat sat", " on the mat"), _Req("A", " b"), _Req("", "Hello world")]
    res = lm.loglikelihood(reqs)
    assert len(res) == 3
    ctx, cont = lm._encode_pair("The cat sat", " on the mat")
    ids = ctx + cont
    with torch.inference_mode():
        lp = F.log_softmax(model(torch.tensor([ids]), use_cache=False).logits.float(), -1)[0]
    want = sum(float(lp[len(ctx) - 1 + j, t]) for j, t in enumerate(cont))
    greedy = all(int(lp[len(ctx) - 1 + j].argmax()) == t for j, t in enumerate(cont))
    assert res[0][0] == pytest.approx(want, rel=1e-5, abs=1e-4) and res[0][1] == greedy
    roll = lm.loglikelihood_rolling([_Req("Some text to score")])
    assert len(roll) == 1 and roll[0] < 0


def test_vllm_backend_reports_missing_vllm(monkeypatch):
    import replayssm_quant.evals.lm_backend as backend

    monkeypatch.setattr(backend, "vllm_available", lambda: False)
    with pytest.raises(backend.VLLMUnavailable, match="needs vLLM"):
        backend.vllm_lm("some/model", "fp32")


def test_vllm_engine_args_follow_the_plugin():
    from replayssm_quant.evals.lm_backend import vllm_engine_args

    a = vllm_engine_args("nvfp4-read/fp32")
    assert a["additional_config"] == {"replayssm_quant": "ckpt=fp32,read=nvfp4,L=16"}
    assert a["use_replayssm"] is True and a["replayssm_buffer_len"] == 16
    assert a["enable_prefix_caching"] is False
    b = vllm_engine_args("fp32", seed=5)
    assert b["additional_config"] == {"replayssm_quant": {"config": "ckpt=fp32,read=none,L=1",
                                                          "seed": 5}}
    assert "use_replayssm" not in b
    from replayssm_quant.vllm_plugin.settings import parse_additional_config

    for args in (a, b):  # what the plugin reads back
        text, seed = parse_additional_config(args["additional_config"]["replayssm_quant"])
        assert seed in (0, 5) and "ckpt=" in text


def test_vllm_finish_reasons_matched_to_prompts():
    from lm_eval.utils import hash_string

    from replayssm_quant.evals.lm_backend import _match_outputs

    outs = [((1, 2, 3), "length", 8), ((5, 6), "stop", 2)]
    entries = _match_outputs(["a", "b", "c"], [[1, 2, 3], [4, 5, 6], [9]], outs, [8, 8, 8])
    assert entries[0]["truncated"] is True and entries[0]["prompt_hash"] == hash_string("a")
    assert entries[1]["truncated"] is False  # left-truncated prompt matched by its tail
    assert entries[2]["truncated"] is None  # unknown stays unknown
