"""The probe tasks offline: lm-eval's stock RULER YAMLs built with the fixture tokenizer, the
project's carry_chain YAML scored by MATH-hard's own process_results, the training examples that
must equal lm-eval's prompts byte for byte, and ``eval --tasks ruler`` end to end.

Answers in the end-to-end run are planted through the real decode path (a responder), so the
test checks pairing and per-(subtask, length) results without relying on a tiny model.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch
import yaml

from replayssm_quant.evals import ruler
from replayssm_quant.evals.carry_chain import (
    TASK_YAML,
    CarryChainDifficulty,
    make_docs,
    write_carry_chain_task,
)
from replayssm_quant.evals.probe_data import (
    carry_chain_examples,
    encode_example,
    probe_examples,
    ruler_examples,
)
from replayssm_quant.evals.tasks import stock_task_dir
from replayssm_quant.models.fixture import fixture_path

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODEL = "nemotron-h-tiny"
SUBTASKS = ("niah_single_1", "niah_multikey_2", "niah_multikey_3")
LENGTH = 512


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tokenizer_dir() -> str:
    return str(fixture_path(MODEL))


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir)


def _manager(path: Path):
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(path), include_defaults=False)


def _contexts(task, limit: int) -> dict[int, str]:
    task.build_all_requests(limit=limit, rank=0, world_size=1)
    return {inst.doc_id: inst.args[0] for inst in task.instances}


# ----------------------------------------------------------------------------- ruler
@pytest.fixture(scope="module")
def ruler_tasks(tmp_path_factory, tokenizer_dir):
    out = tmp_path_factory.mktemp("ruler")
    ruler.import_stock_modules()
    group, names = ruler.write_ruler_tasks(out, (*SUBTASKS, "vt"), (LENGTH,), tokenizer_dir,
                                           num_samples=2, seed=0)
    return out, group, names, _manager(out).load([group])


def test_ruler_wrappers_include_the_stock_yaml(ruler_tasks):
    out, group, names, _ = ruler_tasks
    assert group == "ruler_local"
    assert names == [f"{s}_local" for s in SUBTASKS]  # vt needs >= 1024 tokens: left out
    stock = stock_task_dir() / "ruler"
    for name in names:
        cfg = yaml.safe_load((out / f"{name}.yaml").read_text().replace("!function", ""))
        inc = Path(cfg["include"])
        assert inc.is_absolute() and inc.parent == stock and inc.is_file()
        assert cfg["metadata"]["max_seq_lengths"] == [LENGTH]
        assert cfg["metadata"]["num_samples"] == 2


def test_ruler_builds_offline_at_small_length(ruler_tasks, tokenizer):
    _, group, names, loaded = ruler_tasks
    for name in names:
        task = loaded["tasks"][name]
        docs = list(task.test_docs())
        assert len(docs) == 2 and {d["max_length"] for d in docs} == {LENGTH}
        for d in docs:
            assert d["length"] <= LENGTH and d["outputs"][0] in d["input"]
            assert len(tokenizer(d["input"]).input_ids) + 128 <= LENGTH
        assert task.config.generation_kwargs["max_gen_toks"] == 128  # the stock setting
        # the stock scorer: every expected string in the answer window
        assert task.process_results(docs[0], [f" {docs[0]['outputs'][0]}."])[str(LENGTH)] == 1.0
        assert task.process_results(docs[0], [" 0000000."])[str(LENGTH)] == 0.0


def test_ruler_items_are_reproducible(tokenizer_dir):
    a = ruler.ruler_docs("niah_single_1", tokenizer_dir, LENGTH, 2, seed=0)
    assert a == ruler.ruler_docs("niah_single_1", tokenizer_dir, LENGTH, 2, seed=0)
    assert a != ruler.ruler_docs("niah_single_1", tokenizer_dir, LENGTH, 2, seed=1)


def test_ruler_training_example_is_lm_evals_prompt(ruler_tasks, tokenizer_dir):
    _, _, names, loaded = ruler_tasks
    for subtask, name in zip(SUBTASKS, names, strict=True):
        contexts = _contexts(loaded["tasks"][name], 2)
        examples = ruler_examples(subtask, tokenizer_dir, LENGTH, 2, seed=0)  # the eval items
        for doc_id, ex in enumerate(examples):
            assert ex.text[: len(ex.prompt)] == contexts[doc_id]
            assert ex.prompt == contexts[doc_id]
            doc = list(loaded["tasks"][name].test_docs())[doc_id]
            assert all(o in ex.completion for o in doc["outputs"])


def test_ruler_options_and_errors():
    assert ruler.resolve_subtasks(None) == ruler.DEFAULT_SUBTASKS
    with pytest.raises(ValueError, match="unknown RULER subtask 'niah_single_9'"):
        ruler.resolve_subtasks("niah_single_1,niah_single_9")
    assert ruler.parse_context_lengths("4096,2048,4096") == (2048, 4096)
    with pytest.raises(ValueError, match="integers"):
        ruler.parse_context_lengths("2k")
    with pytest.raises(ValueError, match="exceeds nemotron-h-tiny's limit of 16384"):
        ruler.check_context_lengths(MODEL, (4096, 32768))
    with pytest.raises(ValueError, match="needs 1024"):
        ruler.plan(("vt",), (512,))
    assert ruler.num_samples_for(None) == 500 and ruler.num_samples_for(0.01) == 5
    assert ruler.num_samples_for(2) == 2


# ----------------------------------------------------------------------------- carry_chain
@pytest.fixture(scope="module")
def carry_task(tmp_path_factory):
    out = tmp_path_factory.mktemp("carry")
    name = write_carry_chain_task(out, 3, seed=0)
    return _manager(out).load([name])["tasks"][name]


def test_carry_chain_generator_is_seeded_and_long(tokenizer):
    docs = list(make_docs(4, seed=0))
    assert docs == list(make_docs(4, seed=0)) and docs != list(make_docs(4, seed=1))
    assert list(make_docs(2, seed=0)) == docs[:2]
    for d in docs:
        assert len(tokenizer(" " + d["solution"]).input_ids) >= 1000
        assert f"\\boxed{{{d['answer']}}}" in d["solution"]
        rows = re.findall(r"f\((\d)\) = (\d)", d["problem"])
        assert [int(k) for k, _ in rows] == list(range(10))
        table = [int(v) for _, v in rows]
        assert table == d["table"] and sorted(table) == list(range(10))
        x = d["start"]
        for _ in range(d["terms"]):
            x = table[x]
        assert int(d["answer"]) == x
    short = next(make_docs(1, seed=0, difficulty=CarryChainDifficulty(terms=4)))
    assert short["terms"] == 4 and short["solution"].count(" = f(x_") == 4
    with pytest.raises(ValueError, match="at least 2"):
        CarryChainDifficulty(terms=1)


def test_carry_chain_shift_rule_states_only_the_shift(tokenizer):
    """``shift``: f(x) = x + s mod 10 in the prompt (no table), same solution lines; the table
    default is unchanged by the rule option."""
    docs = list(make_docs(8, seed=3, difficulty=CarryChainDifficulty(rule="shift")))
    assert {d["rule"] for d in docs} == {"shift"}
    for d in docs:
        s = int(re.search(r"f\(x\) = x \+ (\d)\$ modulo 10", d["problem"]).group(1))
        assert s in (1, 3, 7, 9) and "table" not in d["problem"]
        assert d["table"] == [(k + s) % 10 for k in range(10)]
        assert int(d["answer"]) == (d["start"] + s * d["terms"]) % 10
        assert len(tokenizer(" " + d["solution"]).input_ids) >= 1000
    assert len({d["problem"] for d in docs}) > 1
    table = next(make_docs(1, seed=3))
    assert table["rule"] == "table" and "given by the table" in table["problem"]
    with pytest.raises(ValueError, match="unknown carry_chain rule"):
        CarryChainDifficulty(rule="nope")


def test_carry_chain_steps_are_short_lookups(tokenizer):
    """A step line is a few tokens, one token per digit, and its value is the table's entry."""
    doc = next(make_docs(1, seed=5))
    steps = [line for line in doc["solution"].splitlines() if " = f(x_" in line]
    assert len(steps) == doc["terms"]
    for line in steps:
        assert len(tokenizer.encode(line + "\n", add_special_tokens=False)) <= 32
        arg, value = re.search(r"= f\((\d)\) = (\d)\$$", line).groups()
        assert doc["table"][int(arg)] == int(value)


def test_carry_chain_yaml_scores_with_math_hard(carry_task):
    assert carry_task.config.process_results.__module__ == "lm_eval.tasks.leaderboard.math.utils"
    doc = list(carry_task.test_docs())[0]
    right = carry_task.process_results(doc, [" " + doc["solution"]])
    other = str((int(doc["answer"]) + 1) % 10)
    head, tail = doc["solution"].rsplit("So $x_", 1)
    wrong = carry_task.process_results(doc, [" " + head + "So $x_" + tail.replace(doc["answer"], other)])
    assert right["exact_match"] == 1 and wrong["exact_match"] == 0
    assert yaml.safe_load(TASK_YAML.read_text().replace("!function", ""))["task"] == "carry_chain"


def test_carry_chain_training_example_is_lm_evals_prompt(carry_task, tokenizer):
    contexts = _contexts(carry_task, 3)
    for doc_id, ex in enumerate(carry_chain_examples(3, seed=0)):
        assert ex.prompt == contexts[doc_id] and ex.prompt.endswith("\n\nSolution:")
        assert ex.completion.endswith("I hope it is correct.")
    ids, mask = encode_example(ex, tokenizer)
    assert ids[-1] == tokenizer.eos_token_id and sum(mask) >= 1000 and not mask[0]
    assert ids[: mask.index(True)] == tokenizer.encode(ex.prompt, add_special_tokens=False)


def test_probe_mix(tokenizer_dir):
    mix = list(probe_examples(tokenizer_dir, lengths=(LENGTH,), subtasks=("niah_single_1", "vt"),
                              ruler_n=2, carry_n=1, seed=3))
    assert sorted(e.task for e in mix) == ["carry_chain", "ruler/niah_single_1@512",
                                           "ruler/niah_single_1@512"]


# ----------------------------------------------------------------------------- end to end
class _Tracking:
    """Passes the CLI's progress through and records which config is running."""

    def __init__(self, inner, state: dict[str, str]) -> None:
        self.inner, self.state = inner, state

    def run_started(self, task, config, index, total):
        self.state["config"] = config
        self.inner.run_started(task, config, index, total)

    def requests(self, done, total):
        self.inner.requests(done, total)

    def run_finished(self, *args):
        self.inner.run_finished(*args)


def _niah_answer(context: str) -> str:
    key = re.search(r"for (\S+) mentioned in the provided text is$", context).group(1)
    return re.search(rf"for {re.escape(key)} is: (\S+)\.", context).group(1)


def test_cli_eval_ruler_end_to_end(tmp_path, monkeypatch):
    """fp32 answers every item; shared-nvfp4 misses the multikey ones (planted)."""
    from typer.testing import CliRunner

    import replayssm_quant.evals.suite as suite
    from replayssm_quant.cli.app import app

    state = {"config": "fp32"}

    def respond(context: str, gen_kwargs: dict) -> str:
        value = _niah_answer(context)
        multikey = "The grass is green" not in context
        return f" {'0' * len(value) if multikey and state['config'] != 'fp32' else value}."

    real = suite.run_suite
    monkeypatch.setattr(suite, "run_suite", lambda settings, out, *, progress=None, **kw: real(
        settings, out, progress=_Tracking(progress, state), responder=respond, **kw))
    out = tmp_path / "ev"
    r = CliRunner().invoke(app, [
        "eval", MODEL, "--tasks", "ruler", "--context-lengths", "512", "--limit", "2",
        "-c", "fp32,shared-nvfp4", "--out", str(out), "--resamples", "200",
        "--ruler-subtasks", "niah_single_1,niah_multikey_2"])
    assert r.exit_code == 0, r.output
    summary = json.loads((out / "summary.json").read_text())
    rows = {(x["task"], x["name"]): x for x in summary["results"]}
    tasks = ("ruler", "ruler/niah_single_1@512", "ruler/niah_multikey_2@512")
    assert set(rows) == {(t, c) for t in tasks for c in ("fp32", "shared-nvfp4")}
    assert rows[("ruler", "fp32")]["n"] == 4 and rows[("ruler", "fp32")]["accuracy"] == 1.0
    assert rows[("ruler/niah_single_1@512", "shared-nvfp4")]["delta"] == 0.0
    assert rows[("ruler/niah_multikey_2@512", "shared-nvfp4")]["accuracy"] == 0.0
    assert rows[("ruler/niah_multikey_2@512", "shared-nvfp4")]["flips_to_wrong"] == 2
    assert rows[("ruler", "shared-nvfp4")]["delta"] == pytest.approx(-0.5)
    run = out / "runs" / "ruler" / "fp32"
    assert sorted(p.name for p in (run / "samples").iterdir()) == [
        "niah_multikey_2_512.jsonl", "niah_single_1_512.jsonl"]
    assert "ruler/niah_single_1@512" in r.output


@pytest.mark.parametrize("args, message", [
    (["--tasks", "ruler", "--ruler-subtasks", "niah_single_9"], "unknown RULER subtask"),
    (["--tasks", "ruler", "--context-lengths", "4096,65536"], "exceeds nemotron-h-tiny's limit"),
    (["--tasks", "ruler", "--context-lengths", "512", "--ruler-subtasks", "vt"], "needs 1024"),
])
def test_cli_eval_ruler_argument_errors(args, message):
    from typer.testing import CliRunner

    from replayssm_quant.cli.app import app

    r = CliRunner().invoke(app, ["eval", MODEL, *args])
    assert r.exit_code == 2 and message in r.output
    assert r.output.count("\n") <= 2


def test_probe_training_packs_completions(tokenizer):
    """The training script rebuilds lm-eval's carry-chain prompt and masks only completions."""
    import importlib.util
    import random

    path = Path(__file__).resolve().parents[1] / "tools" / "train_probes.py"
    spec = importlib.util.spec_from_file_location("train_probes_under_test", path)
    tp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tp)
    for ex, doc in zip(carry_chain_examples(2, seed=4), make_docs(2, seed=4), strict=True):
        assert tp.carry_prompt(doc) == ex.prompt
    pool = tp.ProbePool.carry_chain(tokenizer.backend_tokenizer, 3, seed=4)
    ids, mask = pool.packed(random.Random(0), 4096)
    assert len(ids) == 4097 and ids[-1] == 0 and mask[-1] == 0  # two problems, then padding
    assert 2 * 1000 < int(mask.sum()) < 2 * 1600 and mask[0] == 0
    first = next(s for s in pool.seqs if (ids[: len(s)] == s).all())
    assert mask[len(first) - 1] == 1 and ids[len(first) - 1] == tokenizer.eos_token_id


def test_ruler_items_pair_by_their_index_within_a_length():
    """lm-eval numbers a subtask's items across all its lengths; pairing runs of different
    --limit needs the generator's index within each length."""
    from replayssm_quant.evals.ruler import split_by_length

    samples = [{"doc_id": i, "doc": {"max_length": length, "index": i % 3}, str(length): 1.0}
               for i, length in enumerate([512] * 3 + [1024] * 3)]
    out = split_by_length({"samples": {"niah_single_1": samples}})["samples"]
    assert sorted(out) == ["niah_single_1@1024", "niah_single_1@512"]
    assert [s["doc_id"] for s in out["niah_single_1@1024"]] == [0, 1, 2]


def test_gdn_kernel_check_flags_a_wrong_kernel_and_keeps_the_reference():
    """``tools/gdn_training.py``: the check that lets FLA's GDN train the Qwen3.5 fixture finds
    a kernel whose key gradient is off (the Hopper miscompile's symptom) and passes the
    reference itself; without FLA installed the reference is what transformers calls."""
    import importlib.util
    import sys

    path = Path(__file__).resolve().parents[1] / "tools" / "gdn_training.py"
    spec = importlib.util.spec_from_file_location("gdn_training_under_test", path)
    gdn = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gdn)
    chunk, _ = gdn.reference_functions()
    shapes = {"batch": 1, "length": 96, "heads": 2, "dk": 8, "dv": 8}
    same = gdn.grad_errors(chunk, chunk, "cpu", **shapes)
    assert set(same) == {"output", "dq", "dk", "dv", "dg", "dbeta"} and max(same.values()) == 0.0

    class HalfKeyGrad(torch.autograd.Function):  # identity forward, key gradient halved
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            return 0.5 * grad

    def wrong(q, k, v, **kw):
        return chunk(q, HalfKeyGrad.apply(k), v, **kw)

    errs = gdn.grad_errors(wrong, chunk, "cpu", **shapes)
    assert errs["output"] == 0.0 and errs["dq"] == 0.0
    assert errs["dk"] > gdn.GRAD_TOLERANCE
    bf16 = gdn.grad_errors(chunk, chunk, "cpu", dtype=torch.bfloat16, **shapes)
    assert 1e-4 < max(bf16.values()) < gdn.GRAD_TOLERANCE  # rounding, not a wrong kernel
    if "fla" not in sys.modules and importlib.util.find_spec("fla") is None:
        logged = []
        assert gdn.use_fla("cpu", logged.append, **shapes) is None
        from transformers.models.qwen3_5 import modeling_qwen3_5 as mq

        assert mq.torch_chunk_gated_delta_rule is chunk and "not importable" in logged[0]
