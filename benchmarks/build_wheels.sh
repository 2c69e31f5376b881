#!/usr/bin/env bash
# Build this project's wheels (core/ and every plugins/*/) into a folder.
#
#   bash benchmarks/build_wheels.sh [DEST]          # DEST defaults to .whl
#   PYTHON=/path/to/python bash benchmarks/build_wheels.sh .whl
#
# Uses `python -m pip wheel --no-deps --no-build-isolation`, so the build backend (hatchling) must be
# installed in that Python. A project that fails to build does not stop the others (exit status 1
# at the end). Old sgljit wheels in DEST are removed first (two versions of one package in
# the folder stop a `pip install DEST/*.whl`); other wheels there (tvm-ffi, liger-kernel) are kept.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${1:-.whl}"
PYTHON="${PYTHON:-python3}"

mkdir -p "$DEST"
DEST="$(cd "$DEST" && pwd)"
rm -f "$DEST"/sgljit-*.whl "$DEST"/sgljit_*.whl

projects=("$ROOT/core")
for d in "$ROOT"/plugins/*/; do
    [[ -f "$d/pyproject.toml" ]] && projects+=("${d%/}")
done

failed=()
for p in "${projects[@]}"; do
    echo "== building ${p#"$ROOT"/}"
    if ! "$PYTHON" -m pip wheel -q --no-deps --no-build-isolation --wheel-dir "$DEST" "$p"; then
        failed+=("${p#"$ROOT"/}")
    fi
done

echo "== wheels in $DEST:"
ls -l "$DEST"/*.whl
if ((${#failed[@]})); then
    echo "!! failed to build: ${failed[*]}" >&2
    exit 1
fi
