#!/usr/bin/env bash
# Fetch sglang's jit_kernel (the JIT kernels over apache-tvm-ffi that sgljit replaces) as an
# importable package tree, for the "sglang-jit" benchmark provider (benchmarks/sglang_provider.py).
#
#   bash benchmarks/fetch_sglang_jit.sh [DEST]      # DEST defaults to .whl/sglang_jit at the repo root
#
# Run on a machine with a package index; carry DEST to the GPU machine (inside .whl/, which is
# git-ignored). Environment:
#   SGLANG_VERSION   sglang release to take jit_kernel from (default 0.5.13)
#   SGLANG_WHEEL     use this sglang wheel file instead of downloading one
#   PYTHON           interpreter whose pip downloads the wheel (default python3)
#
# jit_kernel is Python, C++/CUDA sources and headers, identical in every platform's wheel, so any
# one is taken (pinned to CPython 3.12 manylinux x86_64, so the script works from any host). DEST
# gets (about 4 MB):
#   sglang/jit_kernel/**                whole, tests/ included
#   verbatim from the same wheel, modules that need only torch and the standard library:
#     sglang/version.py, sglang/_version.py, sglang/kernel_api_logging.py,
#     sglang/srt/utils/__init__.py, sglang/srt/utils/custom_op.py,
#     sglang/test/__init__.py, sglang/test/ci/__init__.py, sglang/test/ci/ci_register.py (tests)
#   three stubs, for modules whose real import pulls in sglang's server:
#     sglang/__init__.py            empty (the real one imports the whole frontend)
#     sglang/utils.py               is_in_ci() only (SGLANG_IS_IN_CI, as sglang reads it)
#     sglang/srt/utils/common.py    sglang_lib, direct_register_custom_op (reached at import by
#                                   custom_op.register_custom_op) and the is_hip/is_npu/is_xpu/
#                                   is_musa checks it calls, their source copied from the wheel
#   SOURCE.txt                       the wheel's name and sha256, and what was written
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${1:-$ROOT/.whl/sglang_jit}"
VERSION="${SGLANG_VERSION:-0.5.13}"
PYTHON="${PYTHON:-python3}"

mkdir -p "$(dirname "$DEST")"
DEST="$(cd "$(dirname "$DEST")" && pwd)/$(basename "$DEST")"
if [[ -e "$DEST" && ! -d "$DEST/sglang/jit_kernel" && -n "$(ls -A "$DEST" 2>/dev/null)" ]]; then
    echo "!! $DEST exists and does not look like an earlier fetch (no sglang/jit_kernel): not replacing it" >&2
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

echo "== extracting jit_kernel from $(basename "$wheel")"
"$PYTHON" - "$wheel" "$tmp/out" <<'PY'
import ast
import hashlib
import sys
import zipfile
from pathlib import Path

wheel, out = Path(sys.argv[1]), Path(sys.argv[2])
VERBATIM = [
    "sglang/version.py",
    "sglang/_version.py",
    "sglang/kernel_api_logging.py",
    "sglang/srt/utils/__init__.py",
    "sglang/srt/utils/custom_op.py",
    "sglang/test/__init__.py",
    "sglang/test/ci/__init__.py",
    "sglang/test/ci/ci_register.py",
]
# Top-level definitions of sglang/srt/utils/common.py copied into its stub, in this order.
COMMON_NAMES = ["sglang_lib", "is_hip", "is_xpu", "is_npu", "is_musa", "direct_register_custom_op"]

HEADER = "# Stub written by sgljit's benchmarks/fetch_sglang_jit.sh from {wheel}.\n"

STUB_INIT = '''"""sglang package root for the extracted jit_kernel: the real sglang/__init__.py imports sglang's
whole frontend and server; nothing of it is needed by sglang.jit_kernel."""
'''

STUB_UTILS = '''"""The one name sglang.jit_kernel imports from sglang.utils (the real module imports numpy, requests,
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

COMMON_HEAD = '''"""What sglang.jit_kernel reaches of sglang.srt.utils.common: custom_op.register_custom_op calls
direct_register_custom_op when a jit_kernel module is imported (its ops are registered eagerly as
torch.ops.sglang.*), and the jit_kernel tests import is_hip from sglang.srt.utils. The definitions
below are copied from the wheel's sglang/srt/utils/common.py; the rest of it (the server's helpers)
is left out."""

from functools import lru_cache
from typing import Callable, List, Optional

import torch
from torch.library import Library

'''


def common_stub(source: str) -> str:
    tree = ast.parse(source)
    found = {}
    for node in tree.body:
        names = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = [node.name]
        elif isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        for name in names:
            if name in COMMON_NAMES:
                first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
                lines = source.splitlines()[first - 1 : node.end_lineno]
                found[name] = "\n".join(lines)
    missing = [n for n in COMMON_NAMES if n not in found]
    if missing:
        sys.exit(f"sglang/srt/utils/common.py of this wheel lacks {missing}: update the stub list")
    return COMMON_HEAD + "\n\n\n".join(found[n] for n in COMMON_NAMES) + "\n"


digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
with zipfile.ZipFile(wheel) as z:
    names = z.namelist()
    jit = [n for n in names if n.startswith("sglang/jit_kernel/") and not n.endswith("/")]
    if not jit:
        sys.exit(f"{wheel.name} has no sglang/jit_kernel/")
    for n in jit + VERBATIM:
        if n not in names:
            sys.exit(f"{wheel.name} lacks {n}")
        target = out / n
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(z.read(n))
    header = HEADER.format(wheel=wheel.name)
    stubs = {
        "sglang/__init__.py": STUB_INIT,
        "sglang/utils.py": STUB_UTILS,
        "sglang/srt/utils/common.py": common_stub(z.read("sglang/srt/utils/common.py").decode()),
    }
    for n, text in stubs.items():
        (out / n).write_text(header + text)

size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
(out / "SOURCE.txt").write_text(
    f"wheel: {wheel.name}\nsha256: {digest}\n"
    f"extracted: sglang/jit_kernel/** ({len(jit)} files)\n"
    "verbatim: " + ", ".join(VERBATIM) + "\n"
    "stubs: " + ", ".join(stubs) + "\n"
    f"bytes: {size}\n"
)
print(f"   {len(jit)} jit_kernel files, {len(VERBATIM)} verbatim modules, {len(stubs)} stubs, "
      f"{size / 1e6:.1f} MB")
PY

rm -rf "$DEST"
mv "$tmp/out" "$DEST"
echo "== $DEST"
cat "$DEST/SOURCE.txt"
