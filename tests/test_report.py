"""The per-model report: Markdown + one self-contained HTML file whose plots are drawn, opened in
headless Chromium with no console errors."""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from replayssm_quant.cli.app import app
from replayssm_quant.report import build_report
from replayssm_quant.results import Budget, load_results
from tests.headless_chromium import drawn_fraction, find_chromium, inspect_page
from tests.resultdata import write_bench, write_drift

MODEL = "nvidia/NVIDIA-Nemotron-3-Nano-4B"
KL = {"fp32": 0.0, "shared-nvfp4": 0.05, "nvfp4-read/fp8-sr": 0.006, "nvfp4-read/fp16-sr": 0.002,
      "nvfp4-read/fp32": 0.0015, "fp16-sr": 0.003}
TIMES = {"fp32": 100.0, "shared-nvfp4": 30.0, "nvfp4-read/fp8-sr": 60.0,
         "nvfp4-read/fp16-sr": 50.0, "nvfp4-read/fp32": 40.0, "fp16-sr": 70.0}
CHROMIUM = find_chromium()
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install -y chromium); "
                             "the browser checks of the HTML report need it")

runner = CliRunner()


def _task_folder(out: Path, model: str = MODEL) -> Path:
    """A task folder written by the eval command's own summary writer
    (:func:`replayssm_quant.evals.suite.summarize`) from per-item results."""
    from replayssm_quant.evals.paired import ITEM_COLUMNS
    from replayssm_quant.evals.suite import slug, summarize
    from replayssm_quant.precision import parse_config

    rng = np.random.default_rng(0)
    n = 500  # Tango's interval bounds a drop with no discordant item below 1 point from ~400
    ref_correct = rng.random(n) < 0.7
    ref_trunc = rng.random(n) < 0.01
    flips = {"nvfp4-read/fp32": 0.0, "nvfp4-read/fp8-sr": 0.03, "nvfp4-read/fp16-sr": 0.01,
             "shared-nvfp4": 0.25, "fp16-sr": 0.02}
    for task in ("gpqa_diamond", "mmlu_pro"):
        for name in ["fp32", *flips]:
            cfg = parse_config(name)
            flip = rng.random(n) < flips.get(name, 0.0)
            correct = ref_correct & ~flip if name != "fp32" else ref_correct
            trunc = ref_trunc | (rng.random(n) < (0.12 if name == "shared-nvfp4" else 0.0))
            items = pd.DataFrame({
                "model": model, "task": task, "subtask": task, "config": cfg.label,
                "config_string": str(cfg), "seed": 0, "doc_id": np.arange(n),
                "doc_hash": [f"d{i}" for i in range(n)],
                "prompt_hash": [f"p{i}" for i in range(n)], "target": "A",
                "extracted": np.where(correct, "A", "B"), "answer": np.where(correct, "A", "B"),
                "score_raw": correct.astype(float),
                "invalid": False, "truncated": trunc, "finish": "stop", "gen_tokens": 100,
                "prompt_tokens": 50, "correct": correct & ~trunc, "response": "x"})
            for col in ITEM_COLUMNS:  # columns the writer may add later
                if col not in items:
                    items[col] = None
            run = out / "runs" / slug(task) / slug(cfg.label)
            run.mkdir(parents=True)
            items.to_parquet(run / "items.parquet")
            (run / "run.json").write_text(json.dumps({
                "settings": {"model": model, "task": task, "config": str(cfg), "limit": None,
                             "max_gen_toks": 32768},
                "items_total": n, "lm_eval_task": task, "subtasks": [task],
                "ssm_shape": {"kind": "mamba2", "heads": 96, "head_dim": 80, "d_state": 128,
                              "groups": 8, "layers": 21, "act_bytes": 2}}))
    (out / "summary.json").write_text(json.dumps(summarize(out, resamples=300)))
    return out


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("report-in")
    return {"drift": write_drift(root / "drift", KL),
            "tasks": _task_folder(root / "tasks"),
            "bench": write_bench(root / "decode.csv", TIMES)}


@pytest.fixture(scope="module")
def report_dir(inputs, tmp_path_factory):
    out = tmp_path_factory.mktemp("report-out")
    r = runner.invoke(app, ["report", str(inputs["drift"]), str(inputs["tasks"]),
                            "--bench", str(inputs["bench"]), "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out


def test_writes_markdown_html_and_plots(report_dir):
    html = (report_dir / "report.html").read_text()
    md = (report_dir / "report.md").read_text()
    plots = sorted(p.name for p in (report_dir / "plots").glob("*.png"))
    assert plots == ["cost_vs_drift.png", "decay_spectrum.png", "kl_vs_position.png",
                     "task_accuracy.png"]
    for name in plots:
        assert f"](plots/{name})" in md
    for heading in ("## Recommendation", "## Drift: KL vs position", "## Decay spectrum",
                    "## Task accuracy", "## Cost"):
        assert heading in md
    # the recommendation on measured time, with the plugin string and the reasons
    assert "**Recommended: `nvfp4-read/fp32`**" in md
    assert '--additional-config \'{"replayssm_quant": "ckpt=fp32,read=nvfp4,L=16"}\'' in md
    assert "`shared-nvfp4` (`ckpt=nvfp4,read=none,L=16`): kl_mean in [1024,2047)" in md
    # per-bucket KL table, task table with paired deltas and truncation, cost table
    assert "| config | [128,256) | [256,512) | [512,1024) | [1024,2047) |" in md
    assert "Δ points [95% CI]" in md and "truncated" in md
    assert "**Truncation above 5%**: gpqa_diamond/shared-nvfp4" in md
    assert "measured µs/step (batch 256)" in md and "bytes/step × 21 layers" in md
    assert "Peer kernels measured in the same run: fla-fused-recurrent" in md
    # self-contained: images inline, no scripts, nothing fetched from anywhere
    assert html.count('src="data:image/png;base64,') == 4
    assert "<script" not in html.lower()
    assert not re.search(r"""(src|href)=["'](?!data:|#)""", html)
    assert "Content-Security-Policy" in html


def test_embedded_plots_are_the_pngs(report_dir):
    from PIL import Image

    html = (report_dir / "report.html").read_text()
    blobs = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    for blob in blobs:
        img = Image.open(io.BytesIO(base64.b64decode(blob)))
        assert img.format == "PNG" and img.width > 400 and img.height > 200
    kl = (report_dir / "plots" / "kl_vs_position.png").read_bytes()
    assert base64.b64encode(kl).decode() in blobs


@needs_chromium
def test_html_opens_without_console_errors_and_plots_are_drawn(report_dir):
    page = inspect_page(report_dir / "report.html", CHROMIUM)
    assert page.errors == []
    assert page.title.startswith(MODEL)
    assert len(page.images) == 4
    for img in page.images:
        assert img["complete"] and img["naturalWidth"] > 400, img["alt"]
        assert img["width"] > 300 and img["height"] > 150, img["alt"]
        frac, colours = drawn_fraction(img["screenshot"])
        # a drawn plot: axes, labels, lines and markers cover a visible share of the image in
        # many colours; a blank or broken image is one flat colour
        assert frac > 0.02 and colours > 40, (img["alt"], frac, colours)


@needs_chromium
def test_browser_checks_catch_errors_and_blank_images(tmp_path):
    """The checks above can fail: a script error, a missing file and a blank plot are seen."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (600, 300), "white").save(buf, format="PNG")
    blank = base64.b64encode(buf.getvalue()).decode()
    page = tmp_path / "bad.html"
    page.write_text(f'<!DOCTYPE html><html><head><title>t</title></head><body>'
                    f'<img alt="blank" src="data:image/png;base64,{blank}">'
                    f'<img alt="gone" src="missing.png">'
                    f'<script>console.error("drawn wrong"); noSuchFunction();</script>'
                    f"</body></html>")
    rep = inspect_page(page, CHROMIUM)
    text = "\n".join(rep.errors)
    assert "drawn wrong" in text and "noSuchFunction" in text and "ERR_FILE_NOT_FOUND" in text
    blank_img = next(i for i in rep.images if i["alt"] == "blank")
    frac, colours = drawn_fraction(blank_img["screenshot"])
    assert frac < 0.001 and colours <= 2
    assert next(i for i in rep.images if i["alt"] == "gone")["naturalWidth"] == 0


def test_real_task_summary_loads(inputs):
    m = load_results([inputs["drift"], inputs["tasks"]]).model()
    assert m.tasks.tasks == ["gpqa_diamond", "mmlu_pro"]
    assert str(m.tasks.reference) == "ckpt=fp32,read=none,L=1"
    assert not m.issues
    row = m.tasks.row("gpqa_diamond", "shared-nvfp4")
    assert row.n == 500 and row.delta < -0.1 and row.drop_hi_points > 10
    assert row.delta_ci_method == "tango-score"
    assert row.truncation_rate > 0.05 and 0 <= row.mcnemar_p <= 1


def test_report_without_tasks_or_recommendation(tmp_path, inputs):
    # drift only, none qualifies: the report says so and still draws everything it has
    drift = write_drift(tmp_path / "drift", {"fp32": 0.02, "nvfp4-read/fp32": 0.03})
    m = load_results([drift]).model()
    rep = build_report(m, Budget())
    md = rep.markdown()
    assert "**No config qualifies.**" in md and "Closest: `fp32`" in md
    assert "## Task accuracy" not in md
    assert {f.key for f in rep.figures} == {"kl_vs_position", "decay_spectrum", "cost_vs_drift"}
    # no SSM shape anywhere: no recommendation, with the reason, and no cost section
    s = json.loads((drift / "summary.json").read_text())
    del s["ssm_shape"]
    (drift / "summary.json").write_text(json.dumps(s))
    rep = build_report(load_results([drift]).model())
    assert rep.recommendation is None and "--shape" in rep.recommendation_error
    assert "No recommendation:" in rep.markdown() and "## Cost" not in rep.markdown()


def test_one_report_per_model(tmp_path):
    a = write_drift(tmp_path / "in" / "a", KL, model="org/model-a")
    b = write_drift(tmp_path / "in" / "b", KL, model="org/model-b")
    r = runner.invoke(app, ["report", str(a), str(b), "--out", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    for name in ("org_model-a", "org_model-b"):
        assert (tmp_path / "out" / name / "report.html").is_file()
        assert (tmp_path / "out" / name / "report.md").is_file()
    r = runner.invoke(app, ["report", str(tmp_path / "in"), "--model", "org/model-b", "--out",
                            str(tmp_path / "one")])
    assert r.exit_code == 0 and (tmp_path / "one" / "report.html").is_file()
    r = runner.invoke(app, ["report", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "error:" in r.output
