#!/usr/bin/env bash
# Fetch sglang's JIT kernels (the kernels over apache-tvm-ffi that sgljit replaces) as an importable
# package tree, for the "sglang-jit" benchmark provider (benchmarks/sglang_provider.py).
#
#   bash benchmarks/fetch_sglang_jit.sh [DEST]      # DEST defaults to .whl/sglang_jit at the repo root
#
# Run on a machine with a package index; carry DEST to the GPU machine (inside .whl/, which is
# git-ignored). Environment:
#   SGLANG_VERSION   sglang release to take the kernels from (default 0.5.23; 0.5.13 and 0.5.10,
#                    with the older layout, stay selectable)
#   SGLANG_WHEEL     use this sglang wheel file instead of downloading one
#   PYTHON           interpreter whose pip downloads the wheels (default python3)
#
# The kernels are Python, C++/CUDA sources and headers, identical in every platform's wheel, so any
# one is taken (pinned to CPython 3.12 manylinux x86_64, so the script works from any host). The
# wheel's layout decides what DEST gets:
#   0.5.23 and later (sglang.kernels: ops/<area>/*.py over jit/), about 9 MB:
#     sglang/kernels/jit/**         whole, and of the rest of sglang/kernels the modules the provider
#                                   calls with all they import (KERNELS_OPS below)
#     verbatim, modules that need only torch and the standard library:
#       sglang/version.py, sglang/_version.py, sglang/srt/environ.py, sglang/srt/utils/custom_op.py
#     stubs, for modules whose real import pulls in sglang's server:
#       sglang/__init__.py            empty (the real one imports the whole frontend)
#       sglang/utils.py               is_in_ci() only (SGLANG_IS_IN_CI, as sglang reads it)
#       sglang/srt/utils/__init__.py  re-exports the stubbed common (the real one also imports zmq)
#       sglang/srt/utils/common.py    sglang_lib, direct_register_custom_op (reached at import by
#                                     custom_op.register_custom_op), is_cuda, get_cuda_version and
#                                     the is_hip/is_npu/is_xpu/is_musa checks, their source copied
#                                     from the wheel, and current_platform as on a CUDA machine
#   0.5.13 and older (sglang/jit_kernel), about 4 MB:
#     sglang/jit_kernel/**          whole, tests/ included
#     verbatim: sglang/version.py, sglang/_version.py, sglang/kernel_api_logging.py,
#       sglang/srt/utils/__init__.py, sglang/srt/utils/custom_op.py,
#       sglang/test/__init__.py, sglang/test/ci/__init__.py, sglang/test/ci/ci_register.py (tests)
#     stubs: sglang/__init__.py, sglang/utils.py (as above), sglang/srt/utils/common.py
#       (sglang_lib, direct_register_custom_op and the is_hip/is_npu/is_xpu/is_musa checks)
#   SOURCE.txt                      the wheel's name and sha256, the layout, and what was written
# sglang.kernels imports msgspec (its kernel specs are msgspec structs): for the newer layout a
# CPython 3.12 manylinux msgspec wheel is downloaded beside DEST (into .whl/ by default, where
# benchmarks/h200.sh installs wheels from), unless one is there already.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${1:-$ROOT/.whl/sglang_jit}"
VERSION="${SGLANG_VERSION:-0.5.23}"
PYTHON="${PYTHON:-python3}"

mkdir -p "$(dirname "$DEST")"
DEST="$(cd "$(dirname "$DEST")" && pwd)/$(basename "$DEST")"
if [[ -e "$DEST" && ! -f "$DEST/SOURCE.txt" && -n "$(ls -A "$DEST" 2>/dev/null)" ]]; then
    echo "!! $DEST exists and does not look like an earlier fetch (no SOURCE.txt): not replacing it" >&2
    exit 1
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

if [[ -n "${SGLANG_WHEEL:-}" ]]; then
    wheel="$SGLANG_WHEEL"
else
    echo "== downloading sglang==$VERSION (wheel only, no dependencies)"
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: \
        --python-version 3.12 --implementation cp --platform manylinux_2_34_x86_64 \
        -d "$tmp" "sglang==$VERSION"
    wheel="$(ls "$tmp"/sglang-*.whl)"
fi

echo "== extracting the JIT kernels from $(basename "$wheel")"
"$PYTHON" - "$wheel" "$tmp/out" <<'PY'
import ast
import hashlib
import sys
import zipfile
from pathlib import Path

wheel, out = Path(sys.argv[1]), Path(sys.argv[2])

# Per layout: the tree taken whole, the modules copied verbatim, and the top-level definitions of
# sglang/srt/utils/common.py copied into its stub, in this order.
LAYOUTS = {
    "kernels": {
        "tree": "sglang/kernels/jit/",
        "verbatim": [
            "sglang/version.py",
            "sglang/_version.py",
            "sglang/srt/environ.py",
            "sglang/srt/utils/custom_op.py",
        ],
        "common": [
            "sglang_lib", "is_cuda", "get_cuda_version", "is_hip", "is_xpu", "is_npu", "is_musa",
            "direct_register_custom_op",
        ],
    },
    "jit_kernel": {
        "tree": "sglang/jit_kernel/",
        "verbatim": [
            "sglang/version.py",
            "sglang/_version.py",
            "sglang/kernel_api_logging.py",
            "sglang/srt/utils/__init__.py",
            "sglang/srt/utils/custom_op.py",
            "sglang/test/__init__.py",
            "sglang/test/ci/__init__.py",
            "sglang/test/ci/ci_register.py",
        ],
        "common": ["sglang_lib", "is_hip", "is_xpu", "is_npu", "is_musa", "direct_register_custom_op"],
    },
}

# sglang.kernels.ops modules benchmarks/sglang_provider.py calls (its OPS table, newer layout): they,
# every package __init__ and top-level module of sglang.kernels, and what these import (anywhere in
# their code: some imports are inside functions) within sglang.kernels are taken; sglang/kernels/jit/
# is taken whole (its C++/CUDA sources include each other across folders).
KERNELS_OPS = [
    "layernorm.norm", "layernorm.grouped_gemma_rmsnorm", "attention.rope",
    "attention.fused_qknorm_rope", "attention.table_qk_norm_rope", "diffusion.rope.qknorm_rope_jit",
    "quantization.per_tensor_quant_fp8", "quantization.per_token_quant_fp8",
    "quantization.per_token_group_quant", "activation.activation",
    "diffusion.modulate.timestep_embedding_jit",
]


def module_file(names: set, module: str):
    path = module.replace(".", "/")
    return next((f for f in (path + ".py", path + "/__init__.py") if f in names), None)


def imported(source: str, module: str, is_package: bool) -> list:
    """Every module ``source`` names in an import statement, wherever it is (a name imported from
    a module may be a submodule: both are listed)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = module.split(".") if is_package else module.split(".")[:-1]
            if node.level:
                base = base[: len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found += [name] + [f"{name}.{a.name}" for a in node.names]
    return found


def kernels_closure(z: zipfile.ZipFile, names: set) -> list:
    """The files of sglang.kernels the provider's modules need (see KERNELS_OPS)."""
    todo = [f"sglang.kernels.ops.{m}" for m in KERNELS_OPS]
    todo += [n[:-3].replace("/", ".") for n in names if n.startswith("sglang/kernels/")
             and n.endswith(".py") and (n.endswith("/__init__.py") or n.count("/") == 2)]
    seen = {}
    while todo:
        module = todo.pop()
        if not module.startswith("sglang.kernels") or module in seen:
            continue
        f = module_file(names, module)
        if f is None:
            continue  # a name defined in a module, not a module
        seen[module] = f
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(2, len(parts))]
        todo += imported(z.read(f).decode(), module, f.endswith("/__init__.py"))
    missing = [m for m in KERNELS_OPS if f"sglang.kernels.ops.{m}" not in seen]
    if missing:
        sys.exit(f"sglang.kernels.ops of this wheel lacks {missing}: update KERNELS_OPS")
    return sorted(set(seen.values()))


HEADER = "# Stub written by sgljit's benchmarks/fetch_sglang_jit.sh from {wheel}.\n"

STUB_INIT = '''"""sglang package root for the extracted JIT kernels: the real sglang/__init__.py imports sglang's
whole frontend and server; nothing of it is needed by the kernels."""
'''

STUB_UTILS = '''"""The one name the JIT kernels import from sglang.utils (the real module imports numpy, requests,
IPython, pydantic and sglang's server settings)."""

import os
import warnings


def is_in_ci() -> bool:
    """``envs.SGLANG_IS_IN_CI.get()``: an EnvBool, default False."""
    value = os.getenv("SGLANG_IS_IN_CI")
    if value is None:
        return False
    if value.lower() in ("true", "1", "yes", "y"):
        return True
    if value.lower() in ("false", "0", "no", "n"):
        return False
    warnings.warn(f'Invalid value for SGLANG_IS_IN_CI: "{value}" is not a valid boolean value, '
                  'using default "False"')
    return False
'''

STUB_SRT_UTILS = '''"""sglang.srt.utils for the extracted kernels: the real package re-exports all of
sglang.srt.utils.common (the server's helpers) and imports zmq; the stubbed common is all the
kernels reach."""

from sglang.srt.utils.common import *  # noqa: F401,F403
'''

COMMON_HEAD = '''"""What the JIT kernels reach of sglang.srt.utils.common: custom_op.register_custom_op calls
direct_register_custom_op when a kernel module is imported (its ops are registered eagerly as
torch.ops.sglang.*), and the kernels' arch helpers call is_cuda / get_cuda_version. The definitions
below are copied from the wheel's sglang/srt/utils/common.py; the rest of it (the server's helpers)
is left out."""

from functools import lru_cache
from typing import Callable, List, Optional

import torch
from torch.library import Library

'''

PLATFORM = '''


class _CudaPlatform:
    """sglang.srt.platforms.current_platform as it is on a CUDA machine, for the one question
    direct_register_custom_op asks of it (the real module probes every device kind)."""

    def is_out_of_tree(self) -> bool:
        return False


current_platform = _CudaPlatform()
'''


def common_stub(source: str, wanted: list) -> str:
    tree = ast.parse(source)
    found = {}
    for node in tree.body:
        names = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = [node.name]
        elif isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        for name in names:
            if name in wanted:
                first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
                lines = source.splitlines()[first - 1 : node.end_lineno]
                found[name] = "\n".join(lines)
    missing = [n for n in wanted if n not in found]
    if missing:
        sys.exit(f"sglang/srt/utils/common.py of this wheel lacks {missing}: update the stub list")
    body = "\n\n\n".join(found[n] for n in wanted) + "\n"
    return COMMON_HEAD + body + (PLATFORM if "current_platform" in body else "")


digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
with zipfile.ZipFile(wheel) as z:
    names = set(z.namelist())
    # sglang.kernels (ops over its jit/ backend) replaced sglang/jit_kernel.
    layout = "kernels" if "sglang/kernels/jit/__init__.py" in names else "jit_kernel"
    spec = LAYOUTS[layout]
    tree = sorted(n for n in names if n.startswith(spec["tree"]) and not n.endswith("/"))
    if not tree:
        sys.exit(f"{wheel.name} has neither sglang/kernels/jit/ nor sglang/jit_kernel/")
    if layout == "kernels":
        tree = sorted(set(tree) | set(kernels_closure(z, names)))
    for n in tree + spec["verbatim"]:
        if n not in names:
            sys.exit(f"{wheel.name} lacks {n}")
        target = out / n
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(z.read(n))
    header = HEADER.format(wheel=wheel.name)
    common = z.read("sglang/srt/utils/common.py").decode()
    stubs = {
        "sglang/__init__.py": STUB_INIT,
        "sglang/utils.py": STUB_UTILS,
        "sglang/srt/utils/common.py": common_stub(common, spec["common"]),
    }
    if layout == "kernels":
        stubs["sglang/srt/utils/__init__.py"] = STUB_SRT_UTILS
    for n, text in stubs.items():
        (out / n).parent.mkdir(parents=True, exist_ok=True)
        (out / n).write_text(header + text)

size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
(out / "SOURCE.txt").write_text(
    f"wheel: {wheel.name}\nsha256: {digest}\nlayout: {layout}\n"
    f"extracted: {spec['tree']}**" + (" and the ops' imports" if layout == "kernels" else "")
    + f" ({len(tree)} files)\n"
    "verbatim: " + ", ".join(spec["verbatim"]) + "\n"
    "stubs: " + ", ".join(stubs) + "\n"
    f"bytes: {size}\n"
)
print(f"   layout {layout}: {len(tree)} files, {len(spec['verbatim'])} verbatim "
      f"modules, {len(stubs)} stubs, {size / 1e6:.1f} MB")
PY

rm -rf "$DEST"
mv "$tmp/out" "$DEST"
if grep -q '^layout: kernels$' "$DEST/SOURCE.txt"; then
    wheels="$(dirname "$DEST")"
    if compgen -G "$wheels/msgspec-*.whl" >/dev/null; then
        echo "== msgspec: $(basename "$(ls "$wheels"/msgspec-*.whl | head -1)") already in $wheels"
    else
        echo "== downloading msgspec (imported by sglang.kernels) into $wheels"
        "$PYTHON" -m pip download -q --no-deps --only-binary=:all: \
            --python-version 3.12 --implementation cp --platform manylinux_2_34_x86_64 \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d "$wheels" msgspec
    fi
fi
echo "== $DEST"
cat "$DEST/SOURCE.txt"
