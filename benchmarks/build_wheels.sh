#!/usr/bin/env bash
# Build this project's wheels (core/ and every plugins/*/) into a folder, and with --deps download
# the wheels a GPU machine without a package registry needs beside them.
#
#   bash benchmarks/build_wheels.sh [DEST] [--deps]   # DEST defaults to .whl
#   PYTHON=/path/to/python bash benchmarks/build_wheels.sh .whl --deps
#
# Uses `python -m pip wheel --no-deps --no-build-isolation`, so the build backend (hatchling) must be
# installed in that Python. A project that fails to build does not stop the others (exit status 1
# at the end). Old sgljit wheels in DEST are removed first (two versions of one package in
# the folder stop a `pip install DEST/*.whl`); other wheels there (tvm-ffi, liger-kernel) are kept.
#
# --deps (needs a package index) downloads, for CPython 3.12 on manylinux x86_64 and without their
# dependencies, each of DEPS below that DEST lacks: what sgljit's CUDA builds run on (apache-tvm-ffi,
# ninja >= 1.13: the GPU image's may be older), a benchmark peer (liger-kernel), pytest-xdist for
# 'pytest:-n N' steps, and the build backend tests/core's plugin fixtures install with. (sglang's
# kernels and the msgspec wheel they import come from benchmarks/fetch_sglang_jit.sh.)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST=".whl"
WITH_DEPS=0
for arg in "$@"; do
    case "$arg" in
        --deps) WITH_DEPS=1 ;;
        *) DEST="$arg" ;;
    esac
done
PYTHON="${PYTHON:-python3}"
# name==version (a version the project was tested with) or name alone
DEPS=(
    apache-tvm-ffi==0.1.15.post2 ninja==1.13.2 liger-kernel==0.8.5
    pytest-xdist execnet hatchling pathspec trove-classifiers
)

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

if ((WITH_DEPS)); then
    for req in "${DEPS[@]}"; do
        name="${req%%==*}"
        # wheel file names spell the project name with underscores
        if compgen -G "$DEST/${name//-/_}-*.whl" >/dev/null; then
            echo "== $name: $(basename "$(ls "$DEST/${name//-/_}"-*.whl | head -1)") already there"
            continue
        fi
        echo "== downloading $req"
        if ! "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 \
            --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$DEST" "$req"; then
            failed+=("download $req")
        fi
    done
fi

echo "== wheels in $DEST:"
ls -l "$DEST"/*.whl
if ((${#failed[@]})); then
    echo "!! failed: ${failed[*]}" >&2
    exit 1
fi
