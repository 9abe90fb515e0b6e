"""tools/sass_stats.py: SASS summaries of a compiled kernel (compiled for sm_90 on this CPU
machine with Triton's bundled ptxas, in a subprocess without the interpreter)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "sass_stats.py"


def _module():
    spec = importlib.util.spec_from_file_location("sass_stats", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_summarize_counts_the_main_loop():
    sass = "\n".join([
        "        /*0000*/                   MOV R1, c[0x0][0x28] ;",
        "        /*0010*/                   LDL R2, [R1] ;",
        "        /*0020*/                   FFMA R3, R2, R2, R3 ;",
        "        /*0030*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;",
        "        /*0040*/                   SHFL.BFLY PT, R4, R3, 0x1, 0x1f ;",
        "        /*0050*/              @P0 BRA 0x20 ;",
        "        /*0060*/                   STL [R1], R3 ;",
        "        /*0070*/                   EXIT ;",
    ])
    s = _module().summarize(sass)
    assert s["kernel"]["instructions"] == 8
    assert s["kernel"]["local_memory"] == 2 and s["kernel"]["barriers"] == 1
    loop = s["main_loop"]
    assert loop["instructions"] == 4  # 0x20 .. 0x50
    assert loop["barriers"] == 1 and loop["shuffles"] == 1 and loop["local_memory"] == 0


def _bundled_ptxas() -> bool:
    try:
        import triton
    except ImportError:
        return False
    return (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists()


@pytest.mark.skipif(not _bundled_ptxas(), reason="Triton without its bundled ptxas")
def test_compiles_an_emulator_kernel_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, str(TOOL), "emulate-gdn-conv", "--preset", "fp32",
                          "--block", "4", "--warps", "1", "--json"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    s = json.loads(out.stdout)
    assert 16 <= s["registers"] <= 255
    from replayssm_quant.kernels.core.persistent import programs_per_sm

    assert s["programs_per_sm"] == programs_per_sm(s["registers"], 1)
    assert s["kernel"]["instructions"] > 100
    assert 0 < s["main_loop"]["instructions"] < s["kernel"]["instructions"]
    assert s["main_loop"]["local_memory"] == 0


def test_e4m3_nvfp4_decode_assembles_for_sm90():
    """The Mamba-2 non-flush step's inline-PTX NVFP4 decode (``nvfp4_decode="e4m3"``), which
    the interpreter never runs, assembles for sm_90 with ptxas and takes fewer instructions
    than the fp32-bit-pattern decode; only it converts fp16 to fp32 (HADD2)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = {}
    for mode in ("e4m3", "words"):
        out = subprocess.run([sys.executable, str(TOOL), "mamba2-nonflush", "--preset",
                              "nvfp4-read/fp32", "--block", "16", "--warps", "1",
                              "--nvfp4-decode", mode, "--json"], env=env, cwd=ROOT,
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        res[mode] = json.loads(out.stdout)["kernel"]
    assert res["e4m3"]["instructions"] < res["words"]["instructions"]
    assert "HADD2" in res["e4m3"]["top_ops"] and "HADD2" not in res["words"]["top_ops"]


@pytest.mark.skipif(not _bundled_ptxas(), reason="Triton without its bundled ptxas")
@pytest.mark.parametrize("kind,base", [("gdn", "words"), ("mamba2", "e4m3")])
def test_nvfp4_tensor_core_products_assemble_for_sm90(kind, base):
    """The non-flush steps' tensor-core NVFP4 products (``nvfp4_decode="mma"``) compile for
    sm_90 to HMMA and packed fp16 multiplies, in fewer instructions than the default decode
    with its conversion or FMAs per element, and wait for the ring-products launch (which
    writes the pieces) before the product; the ring-products program that writes them
    assembles too."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = {}
    for mode in ("mma", base):
        out = subprocess.run([sys.executable, str(TOOL), f"{kind}-nonflush", "--preset",
                              "nvfp4-read/fp16-sr", "--block", "64", "--warps", "1", "--pdl",
                              "--nvfp4-decode", mode, "--json"], env=env, cwd=ROOT,
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        res[mode] = json.loads(out.stdout)["kernel"]
    assert res["mma"]["instructions"] < res[base]["instructions"]
    assert res["mma"]["tensor_ops"] > 0 and res[base]["tensor_ops"] == 0
    assert "HMUL2" in res["mma"]["top_ops"]
    assert res["mma"]["grid_waits"] >= 1
    out = subprocess.run([sys.executable, str(TOOL), f"{kind}-prep", "--preset",
                          "nvfp4-read/fp16-sr", "--block", "2", "--warps", "4",
                          "--nvfp4-decode", "mma", "--json"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]


@pytest.mark.parametrize("name,preset,block,waits,releases", [
    ("mamba2-nonflush", "replay-fp32", 64, 1, 1), ("gdn-flush", "replay-fp32", 32, 1, 0),
    ("gdn-verify-prep", "replay-fp32", 16, 0, 1)])
def test_programmatic_launch_assembles_for_sm90(name, preset, block, waits, releases):
    """With ``--pdl`` the kernels carry the ``griddepcontrol`` instructions, which the
    interpreter never runs: ptxas assembles them for sm_90 (ACQBULK waits, PREEXIT releases),
    and without it they carry none."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    for pdl in (True, False):
        out = subprocess.run([sys.executable, str(TOOL), name, "--preset", preset, "--block",
                              str(block), "--warps", "1", "--json"] + (["--pdl"] if pdl else []),
                             env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        k = json.loads(out.stdout)["kernel"]
        assert (k["grid_waits"] >= waits and k["grid_releases"] >= releases) if pdl else \
            (k["grid_waits"] == 0 and k["grid_releases"] == 0)
        if pdl:  # every wait the kernel was built with is there, and no release it was not
            assert (k["grid_waits"] > 0) == (waits > 0) and (k["grid_releases"] > 0) == (releases > 0)


def test_gdn_fp8_nonflush_prefetches_its_ring_records():
    """An fp8 read source makes the GDN non-flush step ask L2 for its ring's u lines before
    the state's loads (``prefetch_records``, a no-op under the interpreter, so only the
    compiled kernel can show it); an fp32 source, where it measured slower, does not."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    seen = {}
    for preset in ("fp8-read/fp32", "replay-fp32"):
        out = subprocess.run([sys.executable, str(TOOL), "gdn-nonflush", "--preset", preset,
                              "--block", "32", "--warps", "1", "--pdl", "--json"],
                             env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        seen[preset] = json.loads(out.stdout)["kernel"]["l2_prefetches"]
    assert seen["fp8-read/fp32"] > 0 and seen["replay-fp32"] == 0, seen


def test_compiles_with_the_launch_specialization():
    """Pointers and integers a launch marks divisible by 16 (not the ``do_not_specialize``
    ones) get ``tt.divisibility = 16``, as Triton's JIT gives them; every target resolves,
    the decode flush too."""
    mod = _module()
    fn, sig, _ = mod.target("emulate-gdn-conv", "bf16-sr", 4)
    attrs = mod.launch_attrs(fn, sig)
    names = {fn.arg_names[k[0]] for k in attrs}
    assert {"q_ptr", "s0_ptr", "o_ptr"} <= names
    assert not names & {"T", "seed", "layer"}
    assert all(v == [["tt.divisibility", 16]] for v in attrs.values())
    fn, sig, consts = mod.target("mamba2-flush", "nvfp4-read/fp16-sr", 32)
    assert sig["rd_ptr"] == "*u8" and sig["ck_ptr"] == "*fp16" and consts["L"] == 16
    fn, sig, consts = mod.target("mamba2-nonflush", "nvfp4-read/fp32", 64)
    assert sig["src_ptr"] == "*u8" and consts["BP"] == 64
    fn, sig, consts = mod.target("gdn-flush", "replay-fp32", 32, fold="records")
    assert consts["RECORDS"] and consts["BVF"] == 32


@pytest.mark.parametrize("name,preset", [
    ("emulate-gdn-conv", "bf16-sr"), ("emulate-gdn-window", "nvfp4-read/fp16-sr"),
    ("gdn-verify", "replay-fp32"), ("mamba2-verify", "nvfp4-read/fp16-sr"),
    ("mamba2-flush", "nvfp4-read/fp8-sr"), ("mamba2-nonflush", "shared-fp8"),
    ("gdn-nonflush", "nvfp4-read/fp32"), ("gdn-flush", "nvfp4-read/fp16-sr"),
    ("gdn-conv", "fp16-sr"), ("mamba2-conv", "fp32"), ("gdn-verify-prep", "replay-fp32"),
    ("mamba2-verify-prep", "nvfp4-read/fp16-sr"), ("emulate-gdn-prep", "replay-fp32"),
    ("gdn-prep", "nvfp4-read/fp16-sr"), ("mamba2-prep", "nvfp4-read/fp16-sr")])
def test_every_target_names_every_kernel_argument(name, preset):
    """A target's signature + constexprs cover every argument of its kernel that has no
    default, and every constexpr (compiling from source needs them even when defaulted): a
    kernel that gains an argument must gain it here too."""
    import inspect

    mod = _module()
    fn, sig, consts = mod.target(name, preset, 16)
    params = inspect.signature(fn.fn).parameters.values()
    given = set(sig) | set(consts)
    missing = [p.name for p in params
               if p.name not in given and (p.default is inspect.Parameter.empty
                                           or "constexpr" in str(p.annotation))]
    assert not missing, missing
    assert not given - {p.name for p in params}


def test_refuses_the_interpreter_and_wrong_presets():
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, str(TOOL), "emulate-gdn-conv", "--preset", "fp32",
                          "--block", "4"], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode != 0 and "TRITON_INTERPRET" in out.stderr
    env.pop("TRITON_INTERPRET")
    out = subprocess.run([sys.executable, str(TOOL), "emulate-gdn-conv", "--preset",
                          "replay-fp32", "--block", "4"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "needs L = 1" in out.stderr


def test_issue_budget_weighs_a_tile_against_its_counted_bytes():
    mod = _module()
    issue = 132 * 4 * 1.98e9 * 32  # thread-instructions per second on the H200
    copy = 0.85 * 4.25e12
    # Nemotron-3-Super's flush of an fp16-SR checkpoint with an NVFP4 read copy, per element:
    # the checkpoint read and written (2 + 2 bytes), the copy's codes, block and row scales
    # (64 + 8 + 4 bytes a 128-element row), 15 ring records of x, dt and B over 8192 x 128
    # elements
    record = 128 * 64 * 2 + 128 * 4 + 8 * 128 * 2
    flush = 4 + 76 / 128 + 15 * record / (8192 * 128)
    stats = {"kernel": {"instructions": 5000}, "main_loop": {"instructions": 3200}}
    b = mod.issue_budget("mamba2-flush", "nvfp4-read/fp16-sr", 16, 2, stats)
    assert b["counted"] == "main_loop" and b["elements_per_thread"] == 32
    assert b["part"] == "flush step"
    assert b["instructions_per_element"] == pytest.approx(100.0)
    assert b["bytes_per_element"] == pytest.approx(flush)
    assert b["budget"] == pytest.approx(issue * flush / copy)
    assert b["over_budget"] == pytest.approx(100.0 / b["budget"])
    # a non-flush program is one tile: the whole listing counts, whatever loop it holds; the
    # Qwen3.5-4B step reads the NVFP4 copy and the records of a window on average, each with
    # the v and beta a narrow copy's flush recomputes u from
    b = mod.issue_budget("gdn-nonflush", "nvfp4-read/fp32", 64, 1, stats)
    assert b["counted"] == "kernel" and b["elements_per_thread"] == 256
    assert b["instructions_per_element"] == pytest.approx(5000 / 256)
    grec = 16 * 128 * 2 + 32 * 128 * 4 + 32 * 4 + 32 * 128 * 2 + 32 * 4  # k, u, g, v, beta
    nonflush = 76 / 128 + sum(k * grec for k in range(1, 16)) / 15 / (32 * 128 * 128)
    assert b["bytes_per_element"] == pytest.approx(nonflush)
    # a conventional step reads and writes its state
    b = mod.issue_budget("mamba2-conv", "fp16-sr", 8, 2, {"kernel": {"instructions": 800}})
    assert b["bytes_per_element"] == 4 and b["instructions_per_element"] == 50
    assert b["part"] == "conventional step"
    with pytest.raises(ValueError, match="decode-step targets"):
        mod.issue_budget("gdn-verify", "replay-fp32", 32, 4, stats)


def test_by_line_attributes_inlined_library_code_to_project_lines():
    mod = _module()
    annotated = "\n".join([
        '\t//## File "/x/replayssm_quant/kernels/gdn.py", line 10',
        "        /*0000*/                   LDL R2, [R1] ;",
        '\t//## File "/site/triton/language/standard.py", line 314 inlined at '
        '"/x/replayssm_quant/kernels/gdn.py", line 12',
        "        /*0010*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;",
        "        /*0020*/                   SHFL.BFLY PT, R4, R3, 0x1, 0x1f ;",
        '\t//## File "/site/triton/language/standard.py", line 287 inlined at '
        '"/site/triton/language/standard.py", line 314',
        "        /*0030*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;",
    ])
    table = mod.line_table(annotated)
    assert table == {0x0: "replayssm_quant/kernels/gdn.py:10",
                     0x10: "replayssm_quant/kernels/gdn.py:12",
                     0x20: "replayssm_quant/kernels/gdn.py:12", 0x30: "standard.py:287"}
    rows = mod.by_line(annotated, table)
    assert rows[0] == ("replayssm_quant/kernels/gdn.py:12", 2, 1, 0)
    assert ("replayssm_quant/kernels/gdn.py:10", 1, 0, 1) in rows
    assert mod.by_line(annotated, table, (0x10, 0x20)) == [
        ("replayssm_quant/kernels/gdn.py:12", 2, 1, 0)]


def test_jit_helpers_take_no_string_defaults():
    """No ``@triton.jit`` helper (a function called from kernels, not launched: its name does
    not end in ``_kernel``) gives a parameter a string default. Triton 3.6, the GPU machine's,
    fails to compile a call that leaves such a constexpr to its default (``'str' object has
    no attribute 'type'``) while the interpreter and newer Triton accept it, so nothing on
    the CPU would notice; the GDN emulator's window prep was broken that way."""
    import ast

    bad = []
    for path in sorted((ROOT / "replayssm_quant" / "kernels").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef) or node.name.endswith("_kernel"):
                continue
            if not any("jit" in ast.unparse(d) for d in node.decorator_list):
                continue
            defaults = node.args.defaults + [d for d in node.args.kw_defaults if d is not None]
            if any(isinstance(d, ast.Constant) and isinstance(d.value, str) for d in defaults):
                bad.append(f"{path.name}:{node.name}")
    assert not bad, bad


def test_compile_check_variants_resolve():
    """Every variant ``tools/compile_check.py`` compiles (CI runs it under the GPU machine's
    Triton) names a target and preset ``sass_stats.target`` builds, with options it takes,
    and no variant is listed twice."""
    spec = importlib.util.spec_from_file_location("compile_check", ROOT / "tools" / "compile_check.py")
    cc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cc)
    mod = _module()
    labels = [cc.label(v) for v in cc.VARIANTS]
    assert len(set(labels)) == len(labels)
    for target, preset, rows, _warps, opts in cc.VARIANTS:
        fn, sig, consts = mod.target(target, preset, rows, **opts)
        assert callable(getattr(fn, "fn", fn)) and sig and consts
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "compile_check.py"), "--list",
                          "-k", "gdn-flush"], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() and all("gdn-flush" in ln for ln in out.splitlines())


def test_constexpr_overrides_parse_and_refuse():
    """``--const NAME=VALUE``: Python literals for the kernel's own arguments; a name the
    kernel lacks, a missing ``=`` or a value that is no literal is refused."""
    over = _module().constexpr_overrides
    names = ["x_ptr", "STAGES", "FOLD_PREC", "TMA"]
    assert over(["STAGES=3", "FOLD_PREC='ieee'", "TMA=True"], names) == {
        "STAGES": 3, "FOLD_PREC": "ieee", "TMA": True}
    assert over([], names) == {}
    for bad, match in (("STAGE=3", "not an argument"), ("STAGES", "NAME=VALUE"),
                       ("=3", "NAME=VALUE"), ("FOLD_PREC=ieee", "Python literal")):
        with pytest.raises(ValueError, match=match):
            over([bad], names)


def test_compile_check_flushes_are_the_default_plans():
    """Each flush variant ``tools/compile_check.py`` compiles is the flush the H200 plan of
    that preset launches at batch 256 (``kernels.plan``): the hand-written list cannot drift
    from the library's defaults, and every preset's default flush is compiled."""
    from replayssm_quant.kernels.plan import step_plan

    spec = importlib.util.spec_from_file_location("compile_check", ROOT / "tools" / "compile_check.py")
    cc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cc)
    listed = {(t, p, rows, warps, o.get("fold", "dot"), o.get("precision", "ieee"), bool(o.get("tma")))
              for t, p, rows, warps, o in cc.VARIANTS if t.endswith("-flush")}
    for kind, shape in (("mamba2", "nemotron-3-super"), ("gdn", "qwen3.5-4b")):
        for preset in ("replay-fp32", "nvfp4-read/fp16-sr", "nvfp4-read/fp8-sr", "nvfp4-read/fp32",
                       "fp8-read/fp32", "shared-fp8", "shared-nvfp4"):
            f = step_plan(shape, preset, 256).flush
            key = (f"{kind}-flush", preset, f.rows, f.warps, f.fold, f.precision, f.tma)
            assert key in listed, key
