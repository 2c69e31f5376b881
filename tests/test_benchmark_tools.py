"""The benchmark harness's machine-readable output and the A/B driver (benchmarks/ab.py), on the CPU
(--dry-run): what GPU sessions rely on to compare kernel variants."""

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import weakref
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import ab  # noqa: E402
import harness  # noqa: E402
import verdict  # noqa: E402


def run_tool(script: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """benchmarks/<script> with args, from the benchmarks folder (as its docstrings show)."""
    return subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        cwd=BENCH,
        env={**os.environ, **(env or {})},
    )


def test_tensor_bytes_skips_tensors_every_copy_shares():
    shared = torch.zeros(1000)
    first = {"x": torch.zeros(10), "cache": shared, "eps": 1e-6}
    second = {"x": torch.zeros(10), "cache": shared, "eps": 1e-6}
    assert harness._tensor_bytes(first) == 4040
    assert harness._tensor_bytes(second, shared_with=first) == 40


def test_json_names_every_case_of_every_series(tmp_path):
    out = tmp_path / "cells.json"
    proc = run_tool("bench_example.py", "--dry-run", "--no-write", "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cells = json.loads(out.read_text())
    timed = [c for c in cells if c["us"] is not None]
    assert timed, cells
    assert all(c["family"] == "example" and c["op"] for c in cells)
    # cases of different series share labels ("T=1"): the series is part of the case's name
    keys = {(c["op"], c["case"], c["provider"]) for c in cells}
    assert len(keys) == len(cells)
    assert all(c["case"].startswith("H=") for c in cells), cells
    floors = [c for c in cells if c["provider"] == harness.FLOOR]
    assert floors and all(c["us"] is not None for c in floors), cells
    # what benchmarks/verdict.py needs of every cell
    assert all(c["bytes"] > 0 and c["l2_bytes"] > 0 and "ceiling_gbps" in c for c in cells)


def test_ab_variant_parsing():
    assert ab.parse_variant("base=") == ("base", "", {})
    assert ab.parse_variant("v=-DA=1 -DB=2 @SGLJIT_PDL=0") == (
        "v",
        "-DA=1 -DB=2",
        {"SGLJIT_PDL": "0"},
    )
    with pytest.raises(Exception, match="NAME=FLAGS"):
        ab.parse_variant("no-equals")
    with pytest.raises(Exception, match="KEY=VALUE"):
        ab.parse_variant("v=@BROKEN")


@pytest.mark.slow
def test_ab_tables_each_variant(tmp_path):
    out = tmp_path / "ab.md"
    proc = run_tool(
        "ab.py",
        "example",
        "--tokens",
        "1,16",
        "--variant",
        "base=",
        "--variant",
        "other=-DUNUSED=1 @SGLJIT_PDL=0",
        "--provider",
        "torch (out=)",
        "--out",
        str(out),
        "--dry-run",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = out.read_text()
    assert "| op | case | base | other |" in table
    rows = [line for line in table.splitlines() if line.startswith("| add |")]
    assert len(rows) >= 2 and all("failed" not in r for r in rows), table


@pytest.mark.slow
def test_ab_times_a_peer_beside_the_first_variant(tmp_path):
    out = tmp_path / "ab.md"
    proc = run_tool(
        "ab.py",
        "example",
        "--tokens",
        "1",
        "--variant",
        "base=",
        "--variant",
        "other=-DUNUSED=1",
        "--provider",
        "torch (out=)",
        "--with-provider",
        "torch",
        "--out",
        str(out),
        "--dry-run",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = out.read_text()
    assert "| op | case | base | other | torch | torch ÷ best (speed) |" in table, table
    rows = [line for line in table.splitlines() if line.startswith("| add |")]
    # the peer's µs, then its speed against the faster variant, named
    assert rows and all(re.search(r"\| \d+\.\d{3} \(`(base|other)`\) \|$", r) for r in rows), table
    # timed once a round, in the first variant's run only
    assert proc.stdout.count("ab: torch | add |") == len(rows), proc.stdout


def test_ab_times_the_provider_alone_without_the_floor():
    # ab.py keeps one time per (op, case): a floor cell would be taken for the provider's
    cmd = ab.bench_command("example", ["--tokens", "1"], "sgljit")
    args = harness.parse_args(cmd[2:], "example")
    assert args.providers == "sgljit" and args.no_floor


def test_ab_fails_loudly_when_nothing_is_timed():
    proc = run_tool("ab.py", "example", "--tokens", "1", "--variant", "base=", "--dry-run")
    assert proc.returncode != 0
    assert "no case of example was timed for provider 'sgljit'" in proc.stdout + proc.stderr


def test_sglang_jit_provider_says_how_to_fetch_it(monkeypatch, tmp_path):
    import sglang_provider

    monkeypatch.setenv("SGLANG_JIT_PATH", str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError, match=r"fetch_sglang_jit\.sh"):
        sglang_provider.load_rmsnorm()
    with pytest.raises(FileNotFoundError):  # a missing tree is the reason before a missing op
        sglang_provider.load_gemma_rmsnorm()
    assert harness.versions()["sglang-jit"] == "missing"


# Resolves every op of the sglang-jit provider's table in a fresh interpreter (importing the fetched
# tree puts its sglang package in sys.modules): "ok", "absent: <reason>" (the release has no such
# op), "needs triton" (a Triton kernel where triton is not installed), or "error: <exception>".
_RESOLVE_ALL = """
import json, sys
sys.path.insert(0, sys.argv[1])
import sglang_provider as sp
out = {}
for op in sp.OPS:
    try:
        fn = sp.resolve(op, need_gpu=False)
        out[op] = "ok" if callable(fn) else f"error: {fn!r} is not callable"
    except NotImplementedError as e:
        out[op] = f"absent: {e}"
    except ModuleNotFoundError as e:
        out[op] = "needs triton" if e.name == "triton" else f"error: {e!r}"
    except Exception as e:
        out[op] = f"error: {e!r}"
print(json.dumps({"layout": sp.layout(), "version": sp.version(), "ops": out}))
"""


def test_sglang_jit_provider_maps_every_op_of_the_fetched_tree():
    """Every op the provider maps imports from the fetched tree (its modules import on the CPU and
    fail only when a kernel is called), and every op it calls absent is absent there."""
    import sglang_provider

    if sglang_provider.layout() is None:
        pytest.skip(
            f"sglang's kernels are not fetched into {sglang_provider.path()} "
            "(run benchmarks/fetch_sglang_jit.sh; it needs a package index)"
        )
    proc = subprocess.run(
        [sys.executable, "-c", _RESOLVE_ALL, str(BENCH)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.splitlines()[-1])
    kind = found["layout"]
    has_triton = importlib.util.find_spec("triton") is not None
    for op, status in found["ops"].items():
        mapped = sglang_provider.OPS[op][kind]
        if isinstance(mapped, str):
            assert status.startswith("absent: ") and mapped in status, (op, status)
        elif status == "needs triton":
            assert not has_triton, (op, status)
        else:
            assert status == "ok", (op, mapped, status)
    if kind == "kernels":  # the ops new in 0.5.23's layout are there
        for op in (
            "gemma_rmsnorm",
            "per_token_quant_fp8",
            "silu_and_mul_per_token_group_quant_fp8",
        ):
            assert found["ops"][op] == "ok", (op, found["ops"][op])


_COMMON = """
import torch
from torch.library import Library


def server_helper():
    import zmq


sglang_lib = Library("sglang", "FRAGMENT")


def is_cuda():
    return True


def get_cuda_version():
    return (13, 0)


def is_hip():
    return False


def is_xpu():
    return False


def is_npu():
    return False


def is_musa():
    return False


def direct_register_custom_op(op_name, op_func, mutates_args):
    if is_npu() or current_platform.is_out_of_tree():
        pass
"""


def _fake_sglang_wheel(path: Path, files: dict[str, str]) -> Path:
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


def _fetch(wheel: Path, dest: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(BENCH / "fetch_sglang_jit.sh"), str(dest)],
        capture_output=True,
        text=True,
        env={**os.environ, "SGLANG_WHEEL": str(wheel), "PYTHON": sys.executable},
    )


def test_fetch_sglang_jit_takes_the_kernels_layout_and_its_imports(tmp_path):
    """0.5.23's layout: jit/ whole, the provider's ops modules and what they import (inside
    functions too), nothing else of sglang.kernels; the server-facing modules stubbed."""
    import ast

    script = (BENCH / "fetch_sglang_jit.sh").read_text()
    listed = re.search(r"KERNELS_OPS = (\[.*?\])", script, re.DOTALL).group(1)
    ops = ast.literal_eval(listed)
    files = {
        "sglang/__init__.py": "import sglang.srt.server  # the frontend\n",
        "sglang/version.py": "",
        "sglang/_version.py": "",
        "sglang/srt/environ.py": "",
        "sglang/srt/utils/__init__.py": "import zmq\n",
        "sglang/srt/utils/custom_op.py": "",
        "sglang/srt/utils/common.py": _COMMON,
        "sglang/kernels/__init__.py": "from sglang.kernels import ops\n",
        "sglang/kernels/spec.py": "",
        "sglang/kernels/jit/__init__.py": "",
        "sglang/kernels/jit/csrc/elementwise/rmsnorm.cuh": "// C++\n",
        "sglang/kernels/ops/__init__.py": "",
        "sglang/kernels/ops/quantization/fp8_kernel.py": "",
        "sglang/kernels/ops/gemm/__init__.py": "",
        "sglang/kernels/ops/gemm/unrelated.py": "",
    }
    for m in ops:
        parts = m.split(".")
        for i in range(1, len(parts)):
            files.setdefault(f"sglang/kernels/ops/{'/'.join(parts[:i])}/__init__.py", "")
        files[f"sglang/kernels/ops/{'/'.join(parts)}.py"] = (
            "def f():\n    from sglang.kernels.ops.quantization.fp8_kernel import g\n"
        )
    wheel = _fake_sglang_wheel(tmp_path / "sglang-9.9.9-cp312-cp312-x.whl", files)
    (tmp_path / "msgspec-0.0-py3-none-any.whl").write_bytes(b"")  # no download
    proc = _fetch(wheel, tmp_path / "tree")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tree = tmp_path / "tree"
    assert "layout: kernels" in (tree / "SOURCE.txt").read_text()
    for n in ("sglang/kernels/jit/csrc/elementwise/rmsnorm.cuh", "sglang/kernels/spec.py",
              "sglang/kernels/ops/quantization/fp8_kernel.py", "sglang/srt/environ.py",
              *(f"sglang/kernels/ops/{m.replace('.', '/')}.py" for m in ops)):  # fmt: skip
        assert (tree / n).is_file(), n
    assert not (tree / "sglang/kernels/ops/gemm/unrelated.py").exists()
    assert "import sglang.srt.server" not in (tree / "sglang/__init__.py").read_text()
    assert "import zmq" not in (tree / "sglang/srt/utils/__init__.py").read_text()
    common = (tree / "sglang/srt/utils/common.py").read_text()
    ast.parse(common)
    assert "def direct_register_custom_op" in common and "current_platform = " in common
    assert "server_helper" not in common


def test_fetch_sglang_jit_keeps_the_jit_kernel_layout(tmp_path):
    files = {
        n: ""
        for n in (
            "sglang/__init__.py", "sglang/version.py", "sglang/_version.py",
            "sglang/kernel_api_logging.py", "sglang/srt/utils/__init__.py",
            "sglang/srt/utils/custom_op.py", "sglang/test/__init__.py",
            "sglang/test/ci/__init__.py", "sglang/test/ci/ci_register.py",
            "sglang/jit_kernel/__init__.py", "sglang/jit_kernel/norm.py",
            "sglang/jit_kernel/tests/test_norm.py",
        )
    }  # fmt: skip
    files["sglang/srt/utils/common.py"] = _COMMON
    wheel = _fake_sglang_wheel(tmp_path / "sglang-0.5.13-cp312-cp312-x.whl", files)
    proc = _fetch(wheel, tmp_path / "tree")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tree = tmp_path / "tree"
    assert "layout: jit_kernel" in (tree / "SOURCE.txt").read_text()
    assert (tree / "sglang/jit_kernel/tests/test_norm.py").is_file()
    assert not list(tmp_path.glob("msgspec-*.whl"))  # only the newer layout needs it
    common = (tree / "sglang/srt/utils/common.py").read_text()
    assert "def direct_register_custom_op" in common and "server_helper" not in common


def test_sglang_jit_provider_tells_the_layouts_apart(monkeypatch, tmp_path):
    import sglang_provider

    monkeypatch.setenv("SGLANG_JIT_PATH", str(tmp_path))
    assert sglang_provider.layout() is None and sglang_provider.version() is None
    (tmp_path / "sglang" / "jit_kernel").mkdir(parents=True)
    (tmp_path / "SOURCE.txt").write_text("wheel: sglang-0.5.13-cp312-cp312-x.whl\n")
    assert sglang_provider.layout() == "jit_kernel" and sglang_provider.version() == "0.5.13"
    with pytest.raises(NotImplementedError, match=r"new in sglang 0\.5\.23"):
        sglang_provider.resolve("table_qk_norm_rope", need_gpu=False)
    (tmp_path / "sglang" / "kernels" / "jit").mkdir(parents=True)
    assert sglang_provider.layout() == "kernels"
    with pytest.raises(NotImplementedError, match=r"removed in sglang 0\.5\.23"):
        sglang_provider.resolve("qknorm_across_heads", need_gpu=False)
    # every op has an entry for both layouts
    assert all(set(where) == {"kernels", "jit_kernel"} for where in sglang_provider.OPS.values())


def test_error_cells_put_the_root_cause_first_and_drop_the_repo_path():
    root = BENCH.parent
    err = RuntimeError(
        f"Tensor match failed for Tensor<1, 1024> at {root}/x/kernel.cuh:134\n"
        "- Root cause: Size mismatch for shape#1('hidden_size'): expected 4096 but got 1024"
    )
    cell = harness._short(err, limit=1000)
    assert cell.startswith("RuntimeError: Root cause: Size mismatch for shape#1"), cell
    assert str(root) not in cell and "at x/kernel.cuh:134" in cell, cell


def test_eager_verdict_needs_six_us_and_sglang_beaten():
    import bench_jit

    assert bench_jit.eager_verdict(5.0, 6.0) == "met"
    assert bench_jit.eager_verdict(5.0, None) == "met"
    assert bench_jit.eager_verdict(6.5, None) == "NOT met: > 6 µs"
    assert bench_jit.eager_verdict(5.0, 4.0) == "NOT met: slower than sglang"
    assert bench_jit.eager_verdict(None, 4.0) == "no sgljit time"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the skip without a GPU")
def test_eager_table_says_why_it_skipped_without_a_gpu():
    import bench_jit

    text, failed = bench_jit.bench_eager(10)
    assert "skipped (needs a CUDA GPU" in text and failed == []


QUANT_OPS = (
    "rmsnorm_quant_fp8_static",
    "rmsnorm_quant_fp8_per_token",
    "fused_add_rmsnorm_quant_fp8_static",
    "fused_add_rmsnorm_quant_fp8_per_token",
)


def test_bench_norm_declares_the_rmsnorm_quant_grid():
    import bench_norm

    found = {op.name: op for op in bench_norm.ops("default")}
    for name in QUANT_OPS:
        op = found[name]
        shapes = {(c.tokens, c.series) for c in op.cases}
        assert shapes == {
            (t, f"H={h} bfloat16 -> e4m3")
            for t in (1, 128, 1024, 4096, 16384, 65536)
            for h in (4096, 5120, 8192)
        }
        assert {p.name for p in op.providers} >= {"sgljit", "sgljit-unfused", "torch.compile"}
    assert all(
        name in {op.name for op in bench_norm.ops(g)}
        for g in ("quick", "models")
        for name in QUANT_OPS
    )


def test_bench_norm_runs_the_rmsnorm_quant_ops_dry():
    proc = run_tool(
        "bench_norm.py",
        "--dry-run",
        "--no-write",
        "--ops",
        ",".join(QUANT_OPS),
        "--tokens",
        "1",
        "--series",
        "H=4096",
        "--providers",
        "sgljit,sgljit-unfused,torch",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in QUANT_OPS:
        assert f"## {name}" in proc.stdout
    assert proc.stdout.count("| sgljit-unfused |") == len(QUANT_OPS), proc.stdout
    assert "failed" not in proc.stdout, proc.stdout


def test_bench_activation_runs_dry():
    """Every op, sgljit beside torch and the fused op's unfused pair, at one token on the CPU."""
    proc = run_tool(
        "bench_activation.py",
        "--dry-run",
        "--no-write",
        "--tokens",
        "1",
        "--providers",
        "sgljit,torch,sgljit-unfused",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"):
        assert f"## {name}" in proc.stdout
    assert "## silu_and_mul_per_token_group_quant_fp8" in proc.stdout
    assert proc.stdout.count("| sgljit-unfused |") == 2, proc.stdout  # d = 2048, 18432
    assert "failed" not in proc.stdout, proc.stdout


def floor_table(subject_us: float, peer_us: float, floor_us: float | None) -> str:
    """op_table of one case: the subject, a peer "torch" and the copy floor (or its error)."""
    case = harness.Case("T=1", 1, lambda device: {}, 1000)
    result = harness.CaseResult(case, 1000, 1)
    result.cells = {
        "sgljit": harness.Cell("sgljit", us=subject_us),
        "torch": harness.Cell("torch", us=peer_us),
        harness.FLOOR: harness.Cell(
            harness.FLOOR, us=floor_us, error=None if floor_us else "missing: triton"
        ),
    }
    return harness.op_table(harness.OpResult(harness.Op("op", [case], []), [result]), None)


@pytest.mark.parametrize(
    ("subject_us", "peer_us", "floor_us", "noted"),
    [
        (10.0, 9.0, 9.0, True),  # subject 0.90x, the peer at the floor
        (10.0, 9.0, 8.9, True),  # the peer within 2% of the floor
        (10.0, 9.0, 9.15, True),  # the peer within 2% faster than the floor
        (10.0, 9.0, 9.5, False),  # the peer 5% faster: that floor kernel is no floor there
        (10.0, 9.0, 8.5, False),  # the peer 6% slower than the floor: sgljit can gain
        (10.0, 9.9, 9.9, False),  # subject 0.99x: it matches the peer
        (10.0, 9.0, None, False),  # no floor time
    ],
)
def test_table_notes_a_peer_at_the_copy_floor(subject_us, peer_us, floor_us, noted):
    table = floor_table(subject_us, peer_us, floor_us)
    subject_row = next(line for line in table.splitlines() if "| **sgljit** |" in line)
    # the floor is a row, never the peer the subject is compared with
    assert f"vs torch{' (peer at the copy floor)' if noted else ''} |" in subject_row, table
    floor_row = next(line for line in table.splitlines() if f"| {harness.FLOOR} |" in line)
    if floor_us:
        assert floor_row.endswith(f"| {floor_us / subject_us:.2f}× |"), table


def test_the_floor_is_never_the_best_peer():
    table = floor_table(10.0, 12.0, 5.0)
    assert "**1.20×** vs torch |" in table, table


def test_bench_norm_times_the_copy_floor_unless_no_floor():
    args = ["--dry-run", "--no-write", "--ops", "rmsnorm,fused_add_rmsnorm", "--tokens", "1"]
    args += ["--series", "H=4096", "--providers", "torch"]  # --providers keeps the floor
    proc = run_tool("bench_norm.py", *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith(f"|  | {harness.FLOOR} |")]
    assert len(rows) == 2, proc.stdout
    assert re.match(rf"\|  \| {harness.FLOOR} \| [0-9.]+ \|", rows[0]), rows  # torch.mul: timed
    # fused_add's Triton floor on the CPU: missing, not fatal (and not "failed" where Triton is)
    if importlib.util.find_spec("triton") is None:
        assert "| missing: ModuleNotFoundError: No module named 'triton' |" in rows[1], rows
    elif os.environ.get("TRITON_INTERPRET") != "1":
        assert "| missing: Unavailable: the Triton floor needs GPU tensors" in rows[1], rows
    assert "copy floor: torch.mul(x, 1, out=out)" in proc.stdout, proc.stdout

    proc = run_tool("bench_norm.py", *args, "--no-floor")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| torch |" in proc.stdout and harness.FLOOR not in proc.stdout, proc.stdout


# Cases per op of each family's --grid default: the shapes the committed result tables were made with
DEFAULT_GRID_CASES = {
    "activation": {
        "silu_and_mul": 13,
        "gelu_and_mul": 13,
        "gelu_tanh_and_mul": 13,
        "silu_and_mul_per_token_group_quant_fp8": 14,
        "silu_and_mul_sorted": 6,
    },
    "rope": {"apply_rope": 16, "apply_rope_with_kv_cache": 11, "qknorm_rope": 21},
    "quant_fp8": {
        "per_tensor_dynamic": 9,
        "per_tensor_static": 9,
        "per_token": 9,
        "per_token_group": 12,
        "per_token_group_col_major": 12,
        "per_token_group_masked": 6,
        "per_token_group_sorted": 6,
    },
    "timestep_embedding": {"timestep_embedding": 18},
}


@pytest.mark.parametrize("family", sorted(DEFAULT_GRID_CASES))
def test_family_grids_have_the_same_ops_and_quick_is_part_of_models(family):
    import importlib

    bench = importlib.import_module(f"bench_{family}")
    grids = {g: {op.name: op for op in bench.ops(g)} for g in harness.GRIDS}
    assert {n: len(op.cases) for n, op in grids["default"].items()} == DEFAULT_GRID_CASES[family]
    for g in ("models", "quick"):
        assert grids[g].keys() == grids["default"].keys()
        for name, op in grids[g].items():
            assert [p.name for p in op.providers] == [
                p.name for p in grids["default"][name].providers
            ]
    for name, op in grids["quick"].items():
        models = {(c.series, c.tokens) for c in grids["models"][name].cases}
        assert {(c.series, c.tokens) for c in op.cases} <= models, name
        assert 0 < len(op.cases) < len(models), name


def _cell(case, provider, us, nbytes=10**6, ceiling=4000.0, l2=50 * 10**6, op="rmsnorm"):
    return {
        "family": "norm",
        "op": op,
        "case": case,
        "tokens": 1,
        "provider": provider,
        "us": us,
        "error": None if us else "failed: x",
        "bytes": nbytes,
        "ceiling_gbps": ceiling,
        "l2_bytes": l2,
    }


def _verdicts(*runs):
    return {v.case: v for v in verdict.collect(list(runs))}


def test_verdict_applies_the_acceptance_rule_cell_by_cell():
    floor = harness.FLOOR
    run1 = [
        *[_cell("win", p, us) for p, us in (("sgljit", 1.0), ("liger", 1.1), (floor, 0.5))],
        *[_cell("tie", p, us) for p, us in (("sgljit", 1.0), ("torch", 0.99))],
        *[_cell("behind", p, us) for p, us in (("sgljit", 1.0), ("torch.compile", 0.9))],
        # the peer is within 2% of the floor: a cell sgljit cannot win by more than noise
        *[_cell("floor", p, us) for p, us in (("sgljit", 1.0), ("liger", 0.9), (floor, 0.89))],
        # sgljit's own variant and the floor are not peers: only torch counts
        *[
            _cell("own", p, us)
            for p, us in (("sgljit", 1.0), ("sgljit-unfused", 0.5), (floor, 0.4), ("torch", 2.0))
        ],
        # no peer timed: not judged
        *[_cell("alone", p, us) for p, us in (("sgljit", 1.0), ("torch", None))],
    ]
    v = _verdicts(run1)
    assert "alone" not in v
    assert {k: x.status for k, x in v.items()} == {
        "win": "win",
        "tie": "tie, one run",
        "behind": "behind",
        "floor": "behind, peer at the copy floor",
        "own": "win",
    }
    assert v["own"].worst.peer == "torch"
    assert {x.case for x in verdict.failing(list(v.values()))} == {"tie", "behind"}

    # a second run: the tie holds on two runs; the worst run decides a cell
    run2 = [
        *[_cell("tie", p, us) for p, us in (("sgljit", 1.0), ("torch", 0.985))],
        *[_cell("win", p, us) for p, us in (("sgljit", 1.0), ("liger", 0.97))],
    ]
    v = _verdicts(run1, run2)
    assert v["tie"].status == "tie"
    assert v["win"].status == "behind" and v["win"].worst.ratio == pytest.approx(0.97)


def test_verdict_holds_large_calls_to_the_ceiling_share():
    big, small = 200 * 10**6, 10**6  # 4x and 1/50 of the 50 MB L2
    # 200 MB in 52.6 µs at a 4000 GB/s ceiling: 95.1%; in 53.2 µs: 94.0%
    run = [
        *[_cell("fast", p, us, nbytes=big) for p, us in (("sgljit", 52.6), ("torch", 60.0))],
        *[_cell("slow", p, us, nbytes=big) for p, us in (("sgljit", 53.2), ("torch", 60.0))],
        # at 50% of the ceiling but within the L2's reach: no share required
        *[_cell("small", p, us, nbytes=small) for p, us in (("sgljit", 0.5), ("torch", 0.6))],
    ]
    v = _verdicts(run)
    assert not v["fast"].below_ceiling and v["slow"].below_ceiling and not v["small"].below_ceiling
    assert [x.case for x in verdict.failing(list(v.values()))] == ["slow"]


def test_verdict_accepts_a_call_below_the_ceiling_share_only_at_the_copy_floor(tmp_path):
    big, floor = 200 * 10**6, harness.FLOOR  # 4x the L2; 60 µs is 83% of the 4000 GB/s ceiling
    run = [
        # the floor kernel is no faster: the op's bytes cannot move faster in its pattern
        *[
            _cell("at", p, us, nbytes=big)
            for p, us in (("sgljit", 60.0), ("torch", 70.0), (floor, 59.5))
        ],
        # the floor moves them 10% faster: sgljit is short of what the bytes allow
        *[
            _cell("off", p, us, nbytes=big)
            for p, us in (("sgljit", 60.0), ("torch", 70.0), (floor, 54.0))
        ],
        # no floor timed: nothing says the share cannot be reached
        *[_cell("none", p, us, nbytes=big) for p, us in (("sgljit", 60.0), ("torch", 70.0))],
    ]
    v = _verdicts(run)
    assert all(x.below_ceiling for x in v.values())
    assert {k for k, x in v.items() if x.below_ceiling_at_floor} == {"at"}
    assert sorted(x.case for x in verdict.failing(list(v.values()))) == ["none", "off"]
    runs = tmp_path / "run.json"
    runs.write_text(json.dumps(run))
    proc = run_tool("verdict.py", str(runs))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "| norm | rmsnorm | at | win, sgljit at the copy floor |" in proc.stdout
    assert "| norm | rmsnorm | 3 | 3 | 0 | 0 | 0 | 0 | 3 | 1 |" in proc.stdout


def test_verdict_reports_and_exits_by_the_rule(tmp_path):
    ok, bad = tmp_path / "ok.json", tmp_path / "bad.json"
    ok.write_text(json.dumps([_cell("a", "sgljit", 1.0), _cell("a", "torch", 1.5)]))
    bad.write_text(
        json.dumps([_cell("b", p, us, op="qknorm") for p, us in (("sgljit", 1), ("liger", 0.8))])
    )
    out = tmp_path / "verdict.md"
    proc = run_tool("verdict.py", str(ok), "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| norm | rmsnorm | 1 | 1 |" in out.read_text()
    proc = run_tool("verdict.py", str(ok), str(bad))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "| norm | qknorm | b | behind | 1.00 | liger | 0.80 | 0.800 |" in proc.stdout
    assert "| norm | rmsnorm | 1 | 1 |" in proc.stdout
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    assert run_tool("verdict.py", str(empty)).returncode == 2


def test_a_second_run_times_only_the_cells_the_first_left_unsettled(tmp_path):
    # verdict.py --rerun lists the cells not accepted yet ...
    first = tmp_path / "first.json"
    first.write_text(
        json.dumps(
            [
                *[_cell("won", p, us) for p, us in (("sgljit", 1.0), ("torch", 1.5))],
                *[_cell("tied", p, us) for p, us in (("sgljit", 1.0), ("torch", 0.99))],
            ]
        )
    )
    rerun = tmp_path / "rerun.json"
    proc = run_tool("verdict.py", str(first), "--rerun", str(rerun))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert json.loads(rerun.read_text()) == [{"family": "norm", "op": "rmsnorm", "case": "tied"}]

    # ... and a bench's --cases times exactly the listed cases of its family
    every = tmp_path / "every.json"
    proc = run_tool("bench_example.py", "--dry-run", "--no-write", "--json", str(every))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cells = json.loads(every.read_text())
    keys = sorted({(c["op"], c["case"]) for c in cells})
    assert len(keys) >= 2, keys
    op, case = keys[-1]
    listed = [
        {"family": "example", "op": op, "case": case},
        {"family": "norm", "op": op, "case": "x"},
    ]
    rerun.write_text(json.dumps(listed))
    second = tmp_path / "second.json"
    proc = run_tool(
        "bench_example.py", "--dry-run", "--no-write", "--cases", str(rerun), "--json", str(second)
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {(c["op"], c["case"]) for c in json.loads(second.read_text())} == {(op, case)}


def test_a_call_that_cannot_run_here_reads_missing_not_failed():
    def needs_gpu(_inputs):
        raise harness.Unavailable("needs GPU tensors")

    def broken(_inputs):
        raise ValueError("wrong")

    case = harness.Case("T=1", 1, lambda device: {"x": torch.zeros(4, device=device)}, 16)
    providers = [
        harness.Provider("sgljit", lambda: broken),
        harness.Provider("torch", lambda: needs_gpu),
    ]
    op = harness.Op("op", [case], providers)
    args = harness.parse_args(["--dry-run", "--no-write"], "example")
    cells = harness.run_op(op, args, torch.device("cpu")).cases[0].cells
    assert cells["torch"].error == "missing: Unavailable: needs GPU tensors", cells
    assert cells["sgljit"].error == "failed: ValueError: wrong", cells


def test_outputs_an_op_allocates_take_a_buffer_per_copy():
    # dropped at once, an output's memory goes back to the allocator, which hands it to the next
    # call (its lines still in the L2 on a GPU): out-of-place providers would be timed partly from
    # cache. Every result must still be alive when the last call runs.
    results, alive = [], []

    def allocating(_inputs):
        out = torch.empty(8)
        results.append(weakref.ref(out))
        alive.append(sum(r() is not None for r in results))
        return out

    harness.call_each(allocating, [{}] * 8)
    assert alive == list(range(1, 9))


def test_precompiled_graphs_serve_the_runs_compiles(tmp_path):
    # --precompile compiles torch.compile's graphs in other processes first; the run's own
    # compiles must then all come from torch's on-disk cache (a key that differs by process, as
    # one did, leaves the run compiling everything again)
    args = ["--dry-run", "--no-write", "--ops", "rmsnorm", "--series", "H=4096"]
    args += ["--providers", "torch.compile", "--no-floor", "--precompile", "2"]
    proc = run_tool("bench_norm.py", *args, env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = re.search(r"torch.compile: (\d+) of (\d+) graphs came from the cache", proc.stdout)
    assert found, proc.stdout
    assert int(found[2]) >= 2 and found[1] == found[2], proc.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--precompile", "-1"], "--precompile: expected a number of processes >= 0"),
        (["--cases", "missing.json"], "--cases: cannot read missing.json"),
        (["--cases", "BAD"], "must hold a JSON list of {family, op, case} records"),
        (["--resume"], "--resume: needs --json FILE"),
        (["--json", "BAD", "--resume"], "must hold a --json run's records"),
        (["--budget", "0"], "--budget: expected seconds > 0"),
    ],
)
def test_bad_run_options_name_themselves(tmp_path, args, says):
    if "BAD" in args:
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps([{"family": "example", "op": "add"}]))
        args = [str(bad) if a == "BAD" else a for a in args]
    proc = run_tool("bench_example.py", "--dry-run", "--no-write", *args)
    assert proc.returncode == 2 and says in proc.stderr, proc.stdout + proc.stderr


def _two_series_op(made: list[str], stop_at: str | None = None, slow: str | None = None):
    """An op of two cases (one a series: a dry run times both). ``made`` collects the labels whose
    inputs were made; ``stop_at``'s inputs stop the run as a time limit does; ``slow``'s subject
    call takes 1.5 s once."""
    slept = []

    def case(label: str, tokens: int) -> harness.Case:
        def inputs(device):
            if label == stop_at:
                raise KeyboardInterrupt  # BaseException: the harness does not catch it
            made.append(label)
            return {"label": label}

        return harness.Case(label, tokens, inputs, 16, series=f"S{tokens}")

    def subject(inputs):
        if inputs["label"] == slow and not slept:
            slept.append(True)
            time.sleep(1.5)

    providers = [harness.fixed(subject, "sgljit"), harness.fixed(lambda i: None, "torch")]
    return harness.Op("op", [case("T=1", 1), case("T=2", 2)], providers)


def _records(path) -> list[tuple[str, str]]:
    return sorted((r["case"], r["provider"]) for r in json.loads(path.read_text()))


def test_a_stopped_run_keeps_its_cases_and_resume_times_only_the_rest(tmp_path, capsys):
    # a grid longer than one call of the GPU machine: --json is rewritten after every case, so a
    # run cut short keeps what it timed; --resume times the rest and tables the whole grid
    cells, out = tmp_path / "cells.json", tmp_path / "tables"
    argv = ["--dry-run", "--json", str(cells), "--out", str(out)]
    made: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        harness.run_family("fam", [_two_series_op(made, stop_at="T=2")], argv)
    assert _records(cells) == [("S1, T=1", "sgljit"), ("S1, T=1", "torch")]

    made.clear()
    assert harness.run_family("fam", [_two_series_op(made)], [*argv, "--resume"]) == 0
    assert made == ["T=2"]  # T=1 came from the file
    assert "resumed: 1 case(s)" in capsys.readouterr().out
    assert _records(cells) == [(f"S{t}, T={t}", p) for t in (1, 2) for p in ("sgljit", "torch")]
    table = (out / "fam.md").read_text()
    assert "S1, T=1" in table and "S2, T=2" in table and "- resumed: 1 case(s)" in table

    # a case without a record of every provider this run times is timed again, its old records
    # replaced: each (case, provider) stays one record
    made.clear()
    records = json.loads(cells.read_text())
    cells.write_text(
        json.dumps([r for r in records if r["provider"] != "torch" or r["case"] != "S2, T=2"])
    )
    harness.run_family("fam", [_two_series_op(made)], [*argv, "--resume"])
    assert made == ["T=2"]
    assert _records(cells) == [(f"S{t}, T={t}", p) for t in (1, 2) for p in ("sgljit", "torch")]


def test_a_budget_stops_starting_cases_and_says_how_many_are_left(tmp_path, capsys):
    cells = tmp_path / "cells.json"
    argv = ["--dry-run", "--no-write", "--json", str(cells), "--budget", "1"]
    made: list[str] = []
    assert harness.run_family("fam", [_two_series_op(made, slow="T=1")], argv) == 0
    assert made == ["T=1"]
    assert "budget: 1 case(s) not timed; run again with --resume" in capsys.readouterr().out
    assert [c for c, _ in _records(cells)] == ["S1, T=1", "S1, T=1"]


class _FakeGpu:
    """torch.cuda's streams, events and graphs over a clock that only calls advance: each call of
    the timed function costs `call_ms` when it runs on the 'GPU' (eagerly, or in a replayed graph)."""

    def __init__(self, call_ms: float):
        self.call_ms, self.now, self.eager_calls, self.capturing = call_ms, 0.0, 0, None
        self.captured: list[int] = []

    def fn(self):
        if self.capturing is not None:
            self.capturing.calls += 1
        else:
            self.eager_calls += 1
            self.now += self.call_ms

    def install(self, monkeypatch):
        gpu = self

        class Graph:
            def __init__(self):
                self.calls = 0

            def replay(self):
                gpu.now += self.calls * gpu.call_ms

            def reset(self):
                self.calls = -1  # replaying a reset graph would go back in time: the test sees it

        class Capture:
            def __init__(self, g):
                self.g = g

            def __enter__(self):
                gpu.capturing = self.g

            def __exit__(self, *exc):
                gpu.captured.append(self.g.calls)
                gpu.capturing = None

        class Event:
            def __init__(self, enable_timing=False):
                self.t = None

            def record(self):
                self.t = gpu.now

            def synchronize(self):
                pass

            def elapsed_time(self, end):
                return end.t - self.t

        class Stream:
            pass

        class UseStream:
            def __init__(self, stream):
                pass

            def __enter__(self):
                pass

            def __exit__(self, *exc):
                pass

        for name, value in {
            "CUDAGraph": Graph,
            "graph": Capture,
            "Event": Event,
            "Stream": Stream,
            "stream": UseStream,
        }.items():
            monkeypatch.setattr(harness.torch.cuda, name, value)


@pytest.mark.parametrize(
    "call_ms, rep_ms, graph_calls",
    [
        (8.6, 25.0, 2),  # 6145 one-token copies: two calls fill a 25 ms replay
        (8.6, 10.0, 1),  # one call's graph is kept
        (0.13, 25.0, 192),  # a large call: many a replay
    ],
)
def test_the_timer_sizes_replays_by_a_graph_and_calls_eagerly_once(
    monkeypatch, call_ms, rep_ms, graph_calls
):
    gpu = _FakeGpu(call_ms)
    gpu.install(monkeypatch)
    ms = harness.bench_cudagraph_ms(gpu.fn, rep_ms)
    assert ms == pytest.approx(call_ms)
    assert gpu.eager_calls == 1  # the warm-up; nothing else runs outside a graph
    want = [1] if graph_calls == 1 else [1, graph_calls]
    assert gpu.captured == want


RECORDING_BENCH = """
import os, sys

import torch
from harness import FLOOR, Case, Op, Provider, run_family


def recorder(name):
    def call(inputs):
        with open(os.environ["CALLS"], "a") as f:
            f.write(f"{os.getpid()} {name} {inputs['case']}\\n")

    return call


def case(series, tokens):
    def make_inputs(device):
        return {"x": torch.zeros(4, device=device), "case": f"{series}/{tokens}"}

    return Case(f"T={tokens}", tokens, make_inputs, 16, series)


def ops(grid="default"):
    cases = [case(s, t) for s in "ABC" for t in (1, 2, 3)]
    providers = [Provider("p", lambda: recorder("p")), Provider("q", lambda: recorder("q"))]
    return [Op("op", cases, providers, subject="p", floor=recorder(FLOOR.replace(" ", "_")))]


if __name__ == "__main__":
    with open(os.environ["CALLS"], "a") as f:
        f.write(f"{os.getpid()} main -\\n")
    sys.exit(run_family("recording", ops))
"""


def test_precompile_calls_every_provider_on_each_case_in_other_processes_before_it_is_timed(
    tmp_path,
):
    # What the run would build one case at a time (sgljit's and sglang's modules, compile graphs,
    # Triton kernels) is built by the precompile workers: each provider and the floor called once
    # on each case the run times, before the run's own first call on that case, in chunks of
    # 2 x JOBS cases (so a budget-stopped run builds little it does not time).
    script, calls = tmp_path / "bench_recording.py", tmp_path / "calls.txt"
    script.write_text(RECORDING_BENCH)
    proc = subprocess.run(
        [sys.executable, str(script), "--dry-run", "--no-write", "--precompile", "2"],
        capture_output=True,
        text=True,
        env={**os.environ, "CALLS": str(calls), "PYTHONPATH": str(BENCH)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line.split() for line in calls.read_text().splitlines()]
    main = lines[0][0]
    assert lines[0][1] == "main"
    timed = [f"{s}/{t}" for s in "ABC" for t in (1, 2)]  # a dry run times two tokens a series
    workers = [(i, name, case) for i, (pid, name, case) in enumerate(lines) if pid != main]
    assert sorted((name, case) for _, name, case in workers) == sorted(
        (p, c) for p in ("p", "q", "copy_floor") for c in timed
    )
    own = {}
    for i, (pid, _, case) in enumerate(lines[1:], 1):
        if pid == main:
            own.setdefault(case, i)
    assert set(own) == set(timed)
    assert all(i < own[case] for i, _, case in workers)
    # two chunks of 4 and 2 cases: the last chunk is built after the first case was timed
    assert own[timed[0]] < max(i for i, _, _ in workers)
    assert "precompile: 18 of 18 provider calls" in proc.stdout


def test_precompile_deals_each_series_first_case_before_any_second():
    cases = [harness.Case(f"T={t}", t, lambda d: {}, 1, s) for s in "AB" for t in (1, 2, 3)]
    order = [f"{c.series}{c.tokens}" for c in harness._series_first(cases)]
    assert order == ["A1", "B1", "A2", "B2", "A3", "B3"]


def test_without_drops_the_providers_it_names_and_keeps_the_floor(tmp_path):
    out = tmp_path / "cells.json"
    proc = run_tool(
        "bench_example.py", "--dry-run", "--no-write", "--without", "torch,not-installed",
        "--json", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    timed = {c["provider"] for c in json.loads(out.read_text())}
    assert timed == {"torch (out=)", harness.COMPILE, harness.FLOOR}
