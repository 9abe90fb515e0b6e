"""Every user error of every command: exit 2, one line, no traceback, before any long work.

One row per case: the arguments (``{tmp}`` is a scratch folder holding the inputs ``_inputs``
makes) and a piece of text the error line must contain.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from replayssm_quant.cli.app import app
from replayssm_quant.models.fixture import fixture_path

TEXT = ("Friends, Romans, countrymen, lend me your ears; I come to bury Caesar, not to praise "
        "him. The evil that men do lives after them; the good is oft interred with their "
        "bones. ") * 3
"""About 500 characters: 500 tokens of a ``random:`` model's byte tokenizer."""


def _inputs(tmp: Path) -> None:
    (tmp / "file").write_text("x\n")
    (tmp / "empty").mkdir()
    (tmp / "short.txt").write_text(TEXT)
    (tmp / "binary.txt").write_bytes(bytes(range(256)) * 40)
    (tmp / "ffd.txt").write_bytes(b"text " + b"\xff\xfe" * 400)
    (tmp / "tiny").mkdir()
    (tmp / "tiny" / "a.txt").write_text("a")
    (tmp / "tiny" / "b.txt").write_text("")
    (tmp / "junk").mkdir()
    (tmp / "junk" / "notes.txt").write_text("no task data here")
    corrupt = tmp / "corrupt"
    shutil.copytree(fixture_path("nemotron-h-tiny"), corrupt)
    weights = corrupt / "model.safetensors"
    with open(weights, "r+b") as fh:
        fh.truncate(weights.stat().st_size // 2)
    _result_folders(tmp)


DRIFT = ["drift", "random:mamba2", "--prefill", "16", "-c", "fp32"]
EVAL = ["eval", "random:mamba2", "--tasks", "gpqa_diamond", "--limit", "2"]
POLICY = str(Path(__file__).resolve().parents[1] / "ci" / "drift_policy.yaml")

CASES: list[tuple[str, list[str], str]] = [
    # case 1: output paths, checked before a model is loaded
    ("drift-out-is-file", [*DRIFT, "--out", "{tmp}/file"], "is a file"),
    ("drift-out-unwritable", [*DRIFT, "--out", "/proc/replayssm-x"], "not writable"),
    ("drift-out-under-file", [*DRIFT, "--out", "{tmp}/file/sub"], "is a file"),
    ("recommend-out-is-file", ["recommend", "{tmp}/empty", "--out", "{tmp}/file"], "is a file"),
    ("recommend-out-unwritable", ["recommend", "{tmp}/empty", "--out", "/proc/replayssm-x"],
     "not writable"),
    ("report-out-is-file", ["report", "{tmp}/empty", "--out", "{tmp}/file"], "is a file"),
    ("report-out-unwritable", ["report", "{tmp}/empty", "--out", "/proc/replayssm-x"],
     "not writable"),
    ("gate-junit-under-file", ["gate", "{tmp}/empty", "--policy", POLICY, "--junit",
                               "{tmp}/file/x.xml"], "--junit"),
    ("gate-markdown-is-folder", ["gate", "{tmp}/empty", "--policy", POLICY, "--markdown",
                                 "{tmp}/empty"], "--markdown"),
    # case 2: corrupt weights
    ("drift-corrupt-weights", ["drift", "{tmp}/corrupt", "--out", "{tmp}/o"],
     "re-download or re-export it"),
    ("eval-corrupt-weights", ["eval", "{tmp}/corrupt", "--data", "{tmp}/junk", "--out",
                              "{tmp}/o"], "re-download or re-export it"),
    # case 4: inputs checked for what they claim
    ("drift-short-strict", [*DRIFT, "--data", "{tmp}/short.txt", "--max-tokens", "4096",
                            "--strict", "--out", "{tmp}/o"], "tokens of the 4,096 asked"),
    ("drift-max-tokens-zero", [*DRIFT, "--max-tokens", "0", "--out", "{tmp}/o"],
     "--max-tokens"),
    ("drift-max-tokens-negative", [*DRIFT, "--max-tokens", "-5", "--out", "{tmp}/o"],
     "--max-tokens"),
    ("drift-docs-zero", [*DRIFT, "--docs", "0", "--out", "{tmp}/o"], "--docs"),
    ("drift-binary-text", [*DRIFT, "--data", "{tmp}/binary.txt", "--out", "{tmp}/o"],
     "not text"),
    ("drift-undecodable-text", [*DRIFT, "--data", "{tmp}/ffd.txt", "--out", "{tmp}/o"],
     "not UTF-8 text"),
    # case 6: eval's bad input
    ("eval-out-is-file", [*EVAL, "--data", "{tmp}/junk", "--out", "{tmp}/file"], "is a file"),
    ("eval-out-unwritable", [*EVAL, "--data", "{tmp}/junk", "--out", "/proc/replayssm-x"],
     "not writable"),
    ("eval-missing-data", [*EVAL, "--data", "{tmp}/nope", "--out", "{tmp}/o"],
     "does not exist"),
    ("eval-empty-data", [*EVAL, "--data", "{tmp}/empty", "--out", "{tmp}/o"], "is empty"),
    ("eval-data-without-tasks", [*EVAL, "--data", "{tmp}/junk", "--out", "{tmp}/o"],
     "GPQA-Diamond"),
    ("eval-bad-model", ["eval", "{tmp}/nope-model", "--data", "{tmp}/junk", "--out",
                        "{tmp}/o"], "cannot load model"),
    ("eval-unknown-architecture", ["eval", "random:llama", "--out", "{tmp}/o"],
     "unsupported architecture"),
    ("eval-offline-without-data", [*EVAL, "--out", "{tmp}/o"], "pass --data"),
    ("eval-bad-limit", [*EVAL, "--limit", "0", "--out", "{tmp}/o"], "--limit"),
    ("eval-bad-backend", [*EVAL, "--backend", "tpu", "--out", "{tmp}/o"], "--backend"),
    ("eval-unknown-task", ["eval", "random:mamba2", "--tasks", "nope", "--out", "{tmp}/o"],
     "nope"),
    ("eval-unknown-carry-rule", ["eval", "nemotron-h-tiny", "--tasks", "carry_chain",
                                 "--carry-rule", "nope", "--out", "{tmp}/o"], "--carry-rule"),
    # case 9: no warnings before the error line for data that holds nothing usable
    ("drift-only-short-documents", [*DRIFT, "--data", "{tmp}/tiny", "--out", "{tmp}/o"],
     "tokens needed"),
    # the errors each command had before
    ("drift-empty-data-folder", [*DRIFT, "--data", "{tmp}/empty", "--out", "{tmp}/o"],
     "holds no"),
    ("drift-missing-data", [*DRIFT, "--data", "{tmp}/nope.txt", "--out", "{tmp}/o"],
     "unknown data source"),
    ("drift-unknown-model", ["drift", "{tmp}/nope-model", "--out", "{tmp}/o"],
     "cannot load model"),
    ("drift-unknown-config", ["drift", "random:mamba2", "-c", "nope", "--out", "{tmp}/o"],
     "nope"),
    ("drift-bad-device", [*DRIFT, "--device", "tpu", "--out", "{tmp}/o"], "device"),
    ("drift-bad-dtype", [*DRIFT, "--dtype", "int3", "--out", "{tmp}/o"], "dtype"),
    ("recommend-missing-results", ["recommend", "{tmp}/nope", "--out", "{tmp}/o"], "nope"),
    ("report-missing-results", ["report", "{tmp}/nope", "--out", "{tmp}/o"], "nope"),
    ("configs-unknown-shape", ["configs", "--shape", "nope"], "unknown shape"),
    ("configs-bad-config", ["configs", "-c", "ckpt=fp3"], "fp3"),
    ("plan-unknown-shape", ["plan", "nope"], "unknown shape"),
    ("plan-bad-knob", ["plan", "-k", "nonsense"], "--knob"),
    ("plan-unknown-knob", ["plan", "-k", "nope=1"], "unknown knob"),
    # case 7: a data file that does not match what summary.json records for it
    ("recommend-truncated-parquet", ["recommend", "{tmp}/damaged/truncated", "--out", "{tmp}/o"],
     "drift.parquet: truncated"),
    ("report-truncated-parquet", ["report", "{tmp}/damaged/truncated", "--out", "{tmp}/o"],
     "rerun the command that made it"),
    ("recommend-altered-parquet", ["recommend", "{tmp}/damaged/altered", "--out", "{tmp}/o"],
     "drift.parquet: altered"),
    ("report-missing-parquet", ["report", "{tmp}/damaged/missing", "--out", "{tmp}/o"],
     "drift.parquet: missing"),
]


def _result_folders(tmp: Path) -> None:
    """Drift folders whose parquet file is cut short, has one byte flipped, or is gone (case 7),
    and a task run of 2 items a task, every answer truncated and invalid (case 3)."""
    import pandas as pd

    from replayssm_quant.evals.records import file_records
    from tests.resultdata import paired_tasks, write_drift

    kl = {"fp32": 0.0, "nvfp4-read/fp32": 0.0015}
    for name in ("truncated", "altered", "missing"):
        folder = write_drift(tmp / "damaged" / name, kl)
        pd.DataFrame({"x": range(1000)}).to_parquet(folder / "drift.parquet")
        summary = json.loads((folder / "summary.json").read_text())
        summary["files"] = file_records(folder, ["drift.parquet"])
        (folder / "summary.json").write_text(json.dumps(summary))
        data = (folder / "drift.parquet").read_bytes()
        if name == "truncated":
            (folder / "drift.parquet").write_bytes(data[: len(data) // 2])
        elif name == "altered":
            (folder / "drift.parquet").write_bytes(data[:64] + bytes([data[64] ^ 1]) + data[65:])
        else:
            (folder / "drift.parquet").unlink()
    write_drift(tmp / "thin" / "drift", kl)
    paired_tasks(tmp / "thin" / "tasks", {"nvfp4-read/fp32": 0}, n=2, truncation=1.0,
                 invalid=1.0)


def test_thin_task_evidence_is_undecided_never_a_pass(scratch):
    """Case 3: 2 items a task, every answer truncated and invalid: no pass, exit 3, and the
    console says why for each config."""
    result = CliRunner().invoke(app, ["recommend", f"{scratch}/thin/drift",
                                      f"{scratch}/thin/tasks", "--out", f"{scratch}/rec-thin"])
    assert result.exit_code == 3 and "Traceback" not in result.output, result.output
    undecided = [ln for ln in result.output.splitlines() if ln.startswith("undecided:")]
    assert any(ln.startswith("undecided: nvfp4-read/fp32:") for ln in undecided), result.output
    assert all("100% of answers truncated (limit 10%)" in ln for ln in undecided)
    assert "recommended:" not in result.output


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("cli-errors")
    _inputs(tmp)
    return tmp


@pytest.mark.parametrize("args, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_user_error_is_one_line_and_exit_2(args, expected, scratch, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # refused at once: "offline"
    argv = [a.replace("{tmp}", str(scratch)) for a in args]
    t0 = time.perf_counter()
    result = CliRunner().invoke(app, argv)
    seconds = time.perf_counter() - t0
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]
    assert [ln for ln in result.stderr.splitlines() if ln.strip()] == lines
    assert seconds < 30, f"{seconds:.1f} s: the error should come before any long work"
    assert not (scratch / "o").exists() or not any((scratch / "o").iterdir())


def test_fixture_without_probe_training_is_refused(tmp_path, monkeypatch):
    """A fixture whose card has no probe training scores 0 on the probes under every config:
    ``eval`` refuses it in one line and names a fixture that has it."""
    import importlib
    import json
    import shutil

    fixture_mod = importlib.import_module("replayssm_quant.models.fixture")

    root = tmp_path / "fixtures"
    for name in fixture_mod.FIXTURES:
        shutil.copytree(fixture_mod.fixture_path(name), root / name)
    card = json.loads((root / "qwen3.5-tiny" / "card.json").read_text())
    del card["probe_training"]
    (root / "qwen3.5-tiny" / "card.json").write_text(json.dumps(card))
    monkeypatch.setattr(fixture_mod, "_ROOT", root)
    result = CliRunner().invoke(app, ["eval", "qwen3.5-tiny", "--tasks", "carry_chain",
                                      "--out", str(tmp_path / "o")])
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "qwen3.5-tiny has no probe training" in lines[0] and "use nemotron-h-tiny" in lines[0]
    assert not (tmp_path / "o").exists()


_RICH_TAG = re.compile(r"(?<!\\)\[[a-zA-Z#/@][^\]\[]*\]")


def _commands() -> dict:
    return typer.main.get_command(app).commands


@pytest.mark.parametrize("name", sorted(_commands()))
def test_help_keeps_every_default_and_bracket(name):
    """A help text with ``[default 0.01]`` is rich markup and vanishes: none may hold a tag,
    and every bracket and default written in a help text shows in ``--help``."""
    command = _commands()[name]
    result = CliRunner().invoke(app, [name, "--help"], env={"COLUMNS": "1000"},
                                terminal_width=1000)
    assert result.exit_code == 0, result.output
    shown = " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.output).split())
    for param in command.params:
        text = getattr(param, "help", None) or ""
        assert not _RICH_TAG.search(text), f"{name} {param.name}: markup in help: {text!r}"
        for piece in re.findall(r"\[[^\]]*\]|\(default[^)]*\)", text):
            assert " ".join(piece.split()) in shown, f"{name} --help lost {piece!r}"

