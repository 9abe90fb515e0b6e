"""Teacher-forced drift: statistics on constructed cases, per-token metrics, KL of the fp32 and
shared-nvfp4 configs, NaN handling, the CLI's error exits, and resuming a killed run."""

from __future__ import annotations

import fcntl
import json
import math
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from replayssm_quant import kernels
from replayssm_quant.cli.app import app
from replayssm_quant.evals.data import Document
from replayssm_quant.evals.drift import NaNLogitsError, run_drift, token_metrics
from replayssm_quant.evals.stats import (
    batch_ids,
    describe,
    drift_stats,
    log_buckets,
    mcnemar,
    mean_ci,
    paired_bootstrap,
    proportion_ci,
)
from replayssm_quant.models.fixture import FIXTURES, fixture, fixture_path
from replayssm_quant.models.registry import ssm_layers
from replayssm_quant.models.tiny import tiny_model
from replayssm_quant.precision import split_configs

TEXT = ("Now is the winter of our discontent made glorious summer by this sun of York; and all "
        "the clouds that lour'd upon our house in the deep bosom of the ocean buried. ") * 12


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ----------------------------------------------------------------------------------- stats
def test_mean_ci_iid_matches_t_interval():
    x = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    m = mean_ci(x)
    se = np.std(x, ddof=1) / math.sqrt(5)
    assert m.mean == 3.0 and m.se == pytest.approx(se)
    assert m.hi - m.mean == pytest.approx(2.7764451 * se, rel=1e-6)  # t(0.975, 4)
    c = mean_ci(np.zeros(10))
    assert (c.lo, c.hi, c.se) == (0.0, 0.0, 0.0)
    assert math.isnan(mean_ci([]).mean) and math.isnan(mean_ci([1.0]).se)


def test_clustered_ci_is_wider_for_correlated_values():
    rng = np.random.default_rng(0)
    # runs of 50 identical values: 2000 values but only 40 independent ones
    x = np.repeat(rng.normal(size=40), 50)
    iid = mean_ci(x)
    clustered = mean_ci(x, batch_ids(x.size, batch=50))
    assert clustered.se == pytest.approx(np.std(x[::50], ddof=1) / math.sqrt(40), rel=1e-9)
    assert clustered.se > 5 * iid.se


def test_batch_ids_stay_inside_groups():
    groups = np.array([0] * 5 + [1] * 3)
    ids = batch_ids(8, groups, batch=2)
    assert ids.tolist() == [0, 0, 1, 1, 2, 3, 3, 4]
    assert batch_ids(16).tolist() == [i // 4 for i in range(16)]
    interleaved = batch_ids(4, np.array([1, 0, 1, 0]), batch=2)
    assert interleaved.tolist() == [1, 0, 1, 0]


def test_describe_and_proportion():
    d = describe(np.arange(101, dtype=float), percentiles=(50.0, 90.0, 99.0, 99.9))
    assert d["median"] == 50 and d["p90"] == 90 and d["p99"] == 99
    assert d["p99_9"] == pytest.approx(99.9) and d["max"] == 100 and d["n"] == 101
    rate, lo, hi = proportion_ci(90, 100)
    assert rate == 0.9 and lo == pytest.approx(0.8256, abs=1e-3) and hi == pytest.approx(
        0.9448, abs=1e-3)  # Wilson interval
    r0, lo0, hi0 = proportion_ci(100, 100)
    assert r0 == 1.0 and hi0 == pytest.approx(1.0) and lo0 < 1.0


def test_drift_stats_on_constructed_case():
    n = 400
    kl = np.full(n, 0.02)
    same = np.arange(n) % 4 != 0  # 75 %
    dp = np.where(np.arange(n) % 2 == 0, 0.1, -0.1)
    nll_ref = np.full(n, 2.0)
    nll = np.full(n, 2.0 + math.log(1.5))
    s = drift_stats(kl, same, dp, nll_ref, nll)
    assert s["n"] == n and s["kl_mean"] == pytest.approx(0.02)
    assert s["kl_ci_lo"] == pytest.approx(0.02) and s["kl_ci_hi"] == pytest.approx(0.02)
    assert s["kl_median"] == pytest.approx(0.02) and s["kl_max"] == pytest.approx(0.02)
    assert s["same_top1"] == 0.75
    assert s["dp_mean"] == pytest.approx(0.0) and s["dp_rms"] == pytest.approx(0.1)
    assert s["ppl_ref"] == pytest.approx(math.exp(2.0))
    assert s["ppl_ratio"] == pytest.approx(1.5) and s["ppl_ratio_lo"] == pytest.approx(1.5)


def test_log_buckets():
    assert log_buckets(128, 2047) == [(128, 256), (256, 512), (512, 1024), (1024, 2047)]
    assert log_buckets(0, 40) == [(0, 16), (16, 32), (32, 40)]
    assert log_buckets(5, 20) == [(5, 16), (16, 20)]
    assert log_buckets(100, 150) == [(100, 150)]
    assert log_buckets(10, 10) == []


def test_paired_tests():
    a = np.array([1, 1, 1, 0, 0, 1, 1, 0], dtype=bool)
    b = np.array([1, 0, 0, 0, 1, 1, 0, 0], dtype=bool)
    m = mcnemar(a, b)
    assert (m["only_a"], m["only_b"], m["discordant"]) == (3, 1, 4)
    assert m["pvalue"] == pytest.approx(0.625)  # two-sided binomial, 1 of 4 at p = 1/2
    assert mcnemar(a, a)["pvalue"] == 1.0
    rng = np.random.default_rng(1)
    x = rng.normal(size=200)
    boot = paired_bootstrap(x, x + 0.5, resamples=2000)
    assert boot.mean == pytest.approx(0.5) and boot.lo == boot.hi == pytest.approx(0.5)
    noisy = paired_bootstrap(x, x + 0.5 + rng.normal(size=200), resamples=2000, seed=3)
    assert noisy.lo < noisy.mean < noisy.hi


# ----------------------------------------------------------------------------------- metrics
class _Head(torch.nn.Module):
    """An LM head stub: hidden states are the logits."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(vocab, vocab, bias=False)
        with torch.no_grad():
            self.proj.weight.copy_(torch.eye(vocab))
        self.config = SimpleNamespace()

    def get_output_embeddings(self):
        return self.proj


def test_token_metrics_against_direct_formulas():
    torch.manual_seed(0)
    n, v = 37, 11
    head = _Head(v)
    zr, zc = torch.randn(n, v) * 3, torch.randn(n, v) * 3
    y = torch.randint(0, v, (n,))
    m = token_metrics(head, zr, zc, y, chunk=5)
    pr, pc = torch.softmax(zr.double(), -1), torch.softmax(zc.double(), -1)
    kl = (pr * (pr.log() - pc.log())).sum(-1)
    np.testing.assert_allclose(m["kl"], kl.numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(m["same_top1"], (zr.argmax(-1) == zc.argmax(-1)).numpy())
    idx = torch.arange(n)
    np.testing.assert_allclose(m["dp"], (pc[idx, y] - pr[idx, y]).numpy(), atol=1e-12)
    np.testing.assert_allclose(m["nll"], (-pc[idx, y].log()).numpy(), rtol=1e-9)
    same = token_metrics(head, zr, zr.clone(), y)
    assert (same["kl"] == 0).all() and same["same_top1"].all() and (same["dp"] == 0).all()
    zc[20, 3] = float("nan")
    with pytest.raises(NaNLogitsError, match="position 120"):
        token_metrics(head, zr, zc, y, chunk=8, positions=torch.arange(100, 100 + n))


# ----------------------------------------------------------------------------------- drift
def _sharp(model_type: str):
    """A tiny random model with a scaled-up LM head and long-memory SSM heads (per-token decay
    near 1, as trained models have), so its distributions are sharp and its states matter."""
    model, tok = tiny_model(model_type)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(40)
        for layer in ssm_layers(model):
            m = layer.module
            m.A_log.copy_(torch.empty(m.A_log.shape).uniform_(-6, -2, generator=gen))
            m.dt_bias.fill_(-2.0)
            m.out_proj.weight.mul_(10)
    return model, tok


def _docs(tok, n: int = 1, length: int = 320) -> list[Document]:
    out = []
    for i in range(n):
        ids = torch.tensor(tok(TEXT[i * 7:])["input_ids"][:length])
        out.append(Document(f"test/{i}", f"doc {i}", ids, "test"))
    return out


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5_text"])
def test_kl_zero_for_fp32_and_positive_for_shared_nvfp4(model_type):
    model, tok = _sharp(model_type)
    docs = _docs(tok)
    r = run_drift(model, ["fp32", "shared-nvfp4"], docs, prefill=64, seed=0)
    pooled = r.pooled.set_index(["config", "bucket"])
    assert abs(pooled.loc[("fp32", "all"), "kl_mean"]) < 1e-9
    assert pooled.loc[("fp32", "all"), "same_top1"] == 1.0
    assert pooled.loc[("fp32", "all"), "ppl_ratio"] == pytest.approx(1.0, abs=1e-5)
    nvfp4 = pooled.loc[("shared-nvfp4", "all"), "kl_mean"]
    assert nvfp4 > 1e-9 and nvfp4 > 1e4 * abs(pooled.loc[("fp32", "all"), "kl_mean"])
    assert list(r.summary["buckets"][0].values())[:1] == ["[64,128)"]
    assert r.summary["positions_per_config"] == 320 - 1 - 64
    assert r.out_dir is None and r.files == {}
    # reference = the fp32 emulation itself: identical computation, KL exactly 0
    r2 = run_drift(model, ["fp32"], docs, prefill=64, reference="fp32")
    assert (r2.pooled["kl_max"] == 0).all()


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_kl(name):
    try:
        fixture_path(name)
    except FileNotFoundError:
        pytest.skip(f"fixture {name} not built")
    model, tok = fixture(name)
    docs = _docs(tok, 1, 256)
    r = run_drift(model, ["fp32", "shared-nvfp4"], docs, prefill=48, model_name=name)
    kl = r.pooled.set_index(["config", "bucket"])["kl_mean"]
    assert abs(kl[("fp32", "all")]) < 1e-9
    assert kl[("shared-nvfp4", "all")] > max(1e-9, 1e3 * abs(kl[("fp32", "all")]))


def test_outputs_written(tmp_path):
    model, tok = _sharp("mamba2")
    run_drift(model, ["fp32", "shared-fp8"], _docs(tok, 2), prefill=32, seed=1,
                  out=tmp_path, model_name="tiny-mamba2")
    for name in ("drift.parquet", "drift_pooled.parquet", "summary.json", "drift.md",
                 "kl_vs_position.png"):
        assert (tmp_path / name).is_file(), name
    per_doc = pd.read_parquet(tmp_path / "drift.parquet")
    assert set(per_doc["doc_id"]) == {"test/0", "test/1"}
    assert set(per_doc["config"]) == {"fp32", "shared-fp8"}
    assert {"[32,64)", "[256,319)", "all"} <= set(per_doc["bucket"])
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["model"] == "tiny-mamba2" and s["prefill"] == 32 and s["seed"] == 1
    assert s["tokens"] == 640 and {"torch", "transformers"} <= set(s["versions"])
    assert [c["name"] for c in s["configs"]] == ["fp32", "shared-fp8"]
    spec = s["decay_spectrum"]
    assert [lay["layer"] for lay in spec["layers"]] == [0, 1]
    assert all(lay["tokens"] == 640 for lay in spec["layers"])
    md = (tmp_path / "drift.md").read_text()
    assert "| `shared-fp8` |" in md and "Decay spectrum" in md
    assert not list((tmp_path / "reference").glob("*.pt"))  # dropped once a document is done
    assert len(list((tmp_path / "pairs").rglob("*.parquet"))) == 4


def test_nan_logits_raise(monkeypatch):
    model, tok = tiny_model("mamba2")
    real = kernels.emulate_mamba2

    def poisoned(*args, **kwargs):
        y, s = real(*args, **kwargs)
        y[:, 5:] = float("nan")
        return y, s

    monkeypatch.setattr(kernels, "emulate_mamba2", poisoned)
    with pytest.raises(NaNLogitsError, match=r"config shared-fp8 on test/0: NaN .* position 37"):
        run_drift(model, ["shared-fp8"], _docs(tok, 1, 100), prefill=32)


def test_split_configs():
    assert split_configs(["shared-nvfp4,nvfp4-read/fp32", "fp32"]) == [
        "shared-nvfp4", "nvfp4-read/fp32", "fp32"]
    assert split_configs(["fp32,ckpt=fp8:sr,read=nvfp4,L=8,shared-fp8 ckpt=fp16,L=4"]) == [
        "fp32", "ckpt=fp8:sr,read=nvfp4,L=8", "shared-fp8", "ckpt=fp16,L=4"]


# ----------------------------------------------------------------------------------- CLI
def _one_error_line(result) -> str:
    """The one error line; in a log, lines of finished units may come before an error that
    only a run can find (NaN)."""
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip() and ": done (" not in ln]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def test_cli_unknown_architecture(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path / "llama"
    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                 num_hidden_layers=1, num_attention_heads=2)).save_pretrained(
        folder)
    result = CliRunner().invoke(app, ["drift", str(folder), "--out", str(tmp_path / "o")])
    line = _one_error_line(result)
    assert "unsupported architecture 'llama'" in line and "nemotron_h" in line


def test_cli_missing_data_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = CliRunner().invoke(app, ["drift", "random:mamba2", "--data", "pg19", "--out",
                                      str(tmp_path)])
    line = _one_error_line(result)
    assert "PG-19" in line and "--data PATH" in line


def test_cli_nan_logits(tmp_path, monkeypatch):
    real = kernels.emulate_mamba2

    def poisoned(*args, **kwargs):
        y, s = real(*args, **kwargs)
        return y * float("nan"), s

    monkeypatch.setattr(kernels, "emulate_mamba2", poisoned)
    (tmp_path / "t.txt").write_text(TEXT)
    result = CliRunner().invoke(app, ["drift", "random:mamba2", "--data", str(tmp_path / "t.txt"),
                                      "--max-tokens", "80", "--prefill", "16", "-c", "shared-fp8",
                                      "--out", str(tmp_path / "o")])
    line = _one_error_line(result)
    assert "NaN" in line and "shared-fp8" in line


def test_cli_runs_and_prints_table(tmp_path):
    (tmp_path / "t.txt").write_text(TEXT)
    result = CliRunner().invoke(app, ["drift", "random:qwen3_5_text", "--data",
                                      str(tmp_path / "t.txt"), "--max-tokens", "120",
                                      "--prefill", "32", "-c", "fp32,shared-fp8",
                                      "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert "shared-fp8" in result.stdout and "[32,64)" in result.stdout
    assert (tmp_path / "o" / "summary.json").is_file()


# ----------------------------------------------------------------------------------- resume
_CONFIGS = "fp32,shared-fp8,nvfp4-read/fp8-sr,fp16-sr"
_DOCS = 3


def _cli(data: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "replayssm_quant.cli.app", "drift", "random:mamba2",
            "--data", str(data), "--docs", str(_DOCS), "--max-tokens", "160", "--prefill", "32",
            "--configs", _CONFIGS, "--out", str(out), "--threads", "1"]


def _results(out: Path) -> tuple[pd.DataFrame, dict]:
    frame = pd.read_parquet(out / "drift.parquet")
    summary = json.loads((out / "summary.json").read_text())
    return frame, summary


def test_killed_run_resumes_to_identical_results(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for i in range(_DOCS):
        (data / f"doc{i}.txt").write_text(TEXT[i * 11:])
    env = os.environ | {"PYTHONWARNINGS": "ignore"}
    full = tmp_path / "full"
    uninterrupted = CliRunner().invoke(app, _cli(data, full)[3:])
    assert uninterrupted.exit_code == 0, uninterrupted.output

    out = tmp_path / "resumed"
    proc = subprocess.Popen(_cli(data, out), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    done = 0
    while time.monotonic() < deadline and proc.poll() is None:
        done = len(list((out / "pairs").rglob("*.parquet"))) if out.exists() else 0
        if done >= 3:
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    n_total = _DOCS * len(_CONFIGS.split(","))
    assert 0 < done < n_total, f"the kill did not land mid-run ({done} of {n_total} pairs)"
    assert not (out / "summary.json").exists()
    finished = {p: p.stat().st_mtime_ns for p in (out / "pairs").rglob("*.parquet")}

    subprocess.run(_cli(data, out), check=True, env=env, capture_output=True, timeout=300)
    for p, mtime in finished.items():  # finished pairs were skipped, not recomputed
        assert p.stat().st_mtime_ns == mtime
    assert len(list((out / "pairs").rglob("*.parquet"))) == n_total
    assert not [p for p in out.rglob("*") if ".tmp-" in p.name]
    f_full, s_full = _results(full)
    f_res, s_res = _results(out)
    pd.testing.assert_frame_equal(f_res, f_full, check_exact=True)
    assert s_res == s_full
    for p in (full / "pairs").rglob("*.parquet"):
        q = out / p.relative_to(full)
        pd.testing.assert_frame_equal(pd.read_parquet(q), pd.read_parquet(p), check_exact=True)


def test_rerun_of_finished_run_is_a_no_op(tmp_path, monkeypatch):
    model, tok = _sharp("mamba2")
    docs = _docs(tok, 1, 120)
    a = run_drift(model, ["shared-fp8"], docs, prefill=16, out=tmp_path)
    calls = []
    real = kernels.emulate_mamba2

    def spy(cfg, *args, **kwargs):
        calls.append(cfg.label)
        return real(cfg, *args, **kwargs)

    monkeypatch.setattr(kernels, "emulate_mamba2", spy)
    b = run_drift(model, ["shared-fp8"], docs, prefill=16, out=tmp_path)
    assert calls == []
    c = run_drift(model, ["shared-fp8", "fp16-sr"], docs, prefill=16, out=tmp_path)
    assert set(calls) == {"fp16-sr"}  # only the new config ran
    pd.testing.assert_frame_equal(a.per_document, b.per_document, check_exact=True)
    assert set(c.per_document["config"]) == {"shared-fp8", "fp16-sr"}


def test_model_name_resolution_errors():
    from replayssm_quant.models.loading import ModelUnavailable, load_model

    with pytest.raises(ModelUnavailable, match="cannot load model"):
        load_model("/nonexistent/model/folder")
    with pytest.raises(ValueError, match="unknown preset"):
        run_drift(tiny_model("mamba2")[0], ["nope"], [])


# ----------------------------------------------------------------------------------- console
# Console output of the drift command in a log (no terminal, COLUMNS=80) and in a real
# 80-column terminal.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def _drift_argv(tmp: Path) -> list[str]:
    (tmp / "t.txt").write_text(TEXT[:300])
    return [sys.executable, "-m", "replayssm_quant.cli.app", "drift", "random:mamba2",
            "--data", str(tmp / "t.txt"), "--max-tokens", "4096", "--prefill", "32",
            "-c", "fp32,nvfp4-read/fp8-sr", "--out", str(tmp / "o"), "--threads", "1"]


def _full_values(out: Path) -> list[str]:
    from replayssm_quant.cli.drift import _fmt

    summary = json.loads((out / "summary.json").read_text())
    return [_fmt(c["overall"]["kl_mean"]) for c in summary["configs"]]


def test_console_in_a_log_at_80_columns(tmp_path):
    """Redirected output: full values and names, a plain line per finished unit, the
    sentence on how to read the table, one warning for the short document."""
    env = os.environ | {"COLUMNS": "80", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(_drift_argv(tmp_path), env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "…" not in proc.stdout and "\x1b" not in proc.stdout + proc.stderr
    for value in _full_values(tmp_path / "o"):
        assert value in proc.stdout
    assert "nvfp4-read/fp8-sr" in proc.stdout and "lower KL is better" in proc.stdout
    assert "fp32 row checks the emulation" in proc.stdout
    warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and "tokens of the 4,096 asked" in warnings[0]
    done = [ln for ln in proc.stderr.splitlines() if ": done (" in ln]
    assert len(done) == 3  # the reference and two configs, one line each


def test_console_in_an_80_column_terminal(tmp_path):
    """A real terminal 80 columns wide: nothing wider than the terminal (a live display
    that wraps scrolls), the table or its records in full, the sentence under it."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 80, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen(_drift_argv(tmp_path), env=env | {"TERM": "xterm"},
                            stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=300) == 0
    os.close(master)
    text = _ANSI.sub("", b"".join(chunks).decode("utf-8", "replace"))
    lines = [seg for line in text.split("\n") for seg in line.split("\r")]
    table_lines = [ln for ln in lines if "│" in ln or "━" in ln]
    assert all(len(ln.rstrip()) <= 80 for ln in table_lines + [ln for ln in lines
                                                              if "tok/s" in ln])
    for value in _full_values(tmp_path / "o"):
        assert value in text
    assert "lower KL is better" in text
