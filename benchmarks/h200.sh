#!/usr/bin/env bash
# Run tests and benchmarks on a GPU machine that has no package registry.
#
#   bash benchmarks/h200.sh STEP [STEP ...]
#
# Run from the repository root. Wheels come from .whl/ (build the project's own with
# benchmarks/build_wheels.sh .whl first; apache-tvm-ffi, ninja>=1.13 and liger-kernel wheels go there too;
# hatchling and trove-classifiers for the tests that build plugin fixtures, diffusers for its integration).
# Output goes to $OUT (default /tmp/sgljit-out):
#   $OUT/h200.log         everything printed, step by step
#   $OUT/results.tar.gz   benchmarks/results/** (extract at the repo root: tar xzf results.tar.gz)
#   $OUT/summary.md       one line per step: status, seconds; then every timed case and test total
# The tarball and summary are refreshed after every step, so a run cut short still returns them.
#
# Steps:
#   env              versions, GPU, installed wheels (always run first, implicitly)
#   tests            python3 -m pytest -x -q tests/ -m "not slow"
#   tests:EXPR       the same with -k EXPR
#   pytest:ARGS      python3 -m pytest ARGS (split as the shell splits words, so quotes group them),
#                    e.g. "pytest:tests/plugins/test_norm.py -k 'cuda or many_rows'"
#                    The whole suite with -n 16 is about 12 minutes of one H200 host (compiles
#                    dominate): split it over calls (tests/plugins after a prebuild; the rest), stop
#                    each with `timeout -s INT` so pytest still reports, and pass --junitxml to learn
#                    which tests a stopped run did not reach.
#   ceiling          measure the streaming ceiling alone (benchmarks/harness.py)
#   bench:FAMILY     python3 benchmarks/bench_FAMILY.py      (bench:FAMILY:ARGS passes ARGS, split on
#                    spaces: 'bench:norm:--tokens 1,65536 --providers sgljit,liger')
#   build            sgljit build --backend cuda --cases --jobs 16: every declared module and every
#                    check case's, in parallel (the tests and memcheck then only load them)
#   grid:FAMILY      the family's models grid (every peer but torch eager, sglang-jit included,
#                    --precompile 12, --rep 10), continued over calls: records in
#                    results/<gpu>/models_grid/FAMILY.json, which --resume keeps (unpack
#                    results.tar.gz into the tree between calls); with a step limit ('@540:grid:norm')
#                    no case starts in its last 90 s
#   grid:FAMILY:GRID the same for another grid of the family script (decode: results/<gpu>/decode_grid/)
#   verdict          python3 benchmarks/verdict.py over every grid's records (results/<gpu>/*_grid/*.json)
#                    into results/<gpu>/verdict.md; non-zero while a cell is behind
#   jit              python3 benchmarks/bench_jit.py          (jit:ARGS likewise, e.g. 'jit:--repeats 3')
#   check            sgljit check
#   memcheck         compute-sanitizer --tool memcheck over every op's CUDA conformance cases (the
#                    spec's check cases: odd widths, one token, strided rows), non-zero on any error
#   sh:COMMAND       any shell command (quote it)
# A failing step does not stop later ones; the script exits non-zero if any step failed.
# Per-step wall limit: STEP_TIMEOUT seconds (default: none); a step written @SECONDS:STEP has its own
# (e.g. '@300:pytest:-n 2 tests/plugins/test_norm.py -k cuda').
set -o pipefail
set -u

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2
OUT="${OUT:-/tmp/sgljit-out}"
mkdir -p "$OUT"
LOG="$OUT/h200.log"
SUMMARY="$OUT/summary.md"
: >"$LOG"
STEP_TIMEOUT="${STEP_TIMEOUT:-}"
LIMIT="$STEP_TIMEOUT"  # the running step's limit

log() { echo "$@" | tee -a "$LOG"; }

# ---- environment ---------------------------------------------------------------------------
export PYTHONUNBUFFERED=1
SITE="${SITE:-/tmp/site}"
WHEELS="${WHEELS:-.whl}"
if compgen -G "$WHEELS/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "$WHEELS"/*.whl 2>&1 | tee -a "$LOG"
    install_rc=${PIPESTATUS[0]}
else
    log "!! no wheels in $WHEELS/ (run benchmarks/build_wheels.sh .whl and carry .whl)"
    install_rc=1
fi
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$SITE/bin:$PATH"

if [[ -z "${CUDA_HOME:-}" ]] && command -v nvcc >/dev/null; then
    # nvcc may be a wrapper script: ask nvcc itself where its binaries are.
    here="$(cd /tmp && echo | nvcc -dryrun -x cu -c - -o /dev/null 2>&1 | sed -n 's/^#\$ _HERE_=//p' | head -1)"
    [[ -n "$here" ]] || here="$(dirname "$(readlink -f "$(command -v nvcc)")")"
    CUDA_HOME="$(cd "$here/.." && pwd)"
fi
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
export SGLJIT_CACHE_DIR="${SGLJIT_CACHE_DIR:-/tmp/sgljit-cache}"
if [[ -z "${SGLJIT_CUDA_ARCH:-}" ]]; then
    SGLJIT_CUDA_ARCH="$(python3 -c 'import torch
if torch.cuda.is_available():
    ma, mi = torch.cuda.get_device_capability()
    print(f"{ma}.{mi}" + ("a" if ma >= 9 else ""))' 2>/dev/null)"
    [[ -n "$SGLJIT_CUDA_ARCH" ]] && export SGLJIT_CUDA_ARCH
fi

# ---- steps ---------------------------------------------------------------------------------
declare -a NAMES=() STATUS=() SECS=()

results_dir() { (cd benchmarks && python3 -c 'import harness; print(harness.results_dir())'); }

pack() {
    if [[ -d benchmarks/results ]]; then
        tar czf "$OUT/results.tar.gz.tmp" benchmarks/results && mv "$OUT/results.tar.gz.tmp" "$OUT/results.tar.gz"
    fi
    {
        echo "| step | status | seconds |"
        echo "|---|---|---|"
        for i in "${!NAMES[@]}"; do
            echo "| ${NAMES[$i]} | ${STATUS[$i]} | ${SECS[$i]} |"
        done
        # One line per timed case and per test total, step by step: what A/B runs need to compare.
        echo
        echo "## timings (µs) and test totals, by step"
        awk '/^======== .*: rc=/ {next}
             /^======== / {n = $0; sub(/^======== /, "", n); sub(/: (bash -c|python3) .*/, "", n); sub(/ ========$/, "", n); print "- " n}
             /^\[/ {c = $0}
             !/^========/ && /MB\/call: / {x = $0; sub(/.*MB\/call: /, "", x); print "    " c " " x}
             / passed| failed/ {print "    " $0}' "$LOG"
    } >"$SUMMARY"
}

run_step() {  # name, command...
    local name="$1"
    shift
    log ""
    log "======== $name: $* ========"
    local t0 rc
    t0=$(date +%s.%N)
    if [[ -n "$LIMIT" ]]; then
        timeout --kill-after=10 "$LIMIT" "$@" 2>&1 | tee -a "$LOG"
    else
        "$@" 2>&1 | tee -a "$LOG"
    fi
    rc=${PIPESTATUS[0]}
    local dt
    dt=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$t0" "$(date +%s.%N)")
    NAMES+=("$name")
    SECS+=("$dt")
    if [[ $rc -eq 0 ]]; then
        STATUS+=("ok")
    elif [[ $rc -eq 124 || $rc -eq 137 ]]; then
        STATUS+=("TIMEOUT (rc $rc)")
    else
        STATUS+=("FAILED (rc $rc)")
    fi
    log "======== $name: rc=$rc, ${dt}s ========"
    pack
}

env_info() {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "CUDA_HOME=$CUDA_HOME SGLJIT_CUDA_ARCH=${SGLJIT_CUDA_ARCH:-} SGLJIT_CACHE_DIR=$SGLJIT_CACHE_DIR"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1
    nvcc --version 2>&1 | tail -2
    python3 - <<'PY'
import importlib
import sys

print("python", sys.version.split()[0])
for name in ("torch", "triton", "tvm_ffi", "liger_kernel", "sgljit", "matplotlib", "ninja", "msgspec"):
    try:
        mod = importlib.import_module(name)
        print(f"{name:14s} {getattr(mod, '__version__', '?'):24s} {getattr(mod, '__file__', '')}")
    except Exception as e:  # noqa: BLE001
        print(f"{name:14s} MISSING ({type(e).__name__}: {e})")
try:
    from importlib.metadata import entry_points

    eps = entry_points(group="sgljit.plugins")
    print("sgljit.plugins entry points:", ", ".join(f"{e.name}={e.value}" for e in eps) or "none")
except Exception as e:  # noqa: BLE001
    print("entry points:", e)
import torch

if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"GPU: {p.name}, {p.multi_processor_count} SMs, L2 {getattr(p, 'L2_cache_size', 0) / 2**20:.0f} MiB,"
          f" {p.total_memory / 2**30:.0f} GiB, cc {p.major}.{p.minor}")
else:
    print("GPU: none visible to torch")
PY
    ls -l "$WHEELS"/
    echo "sglang-jit provider: $(head -1 "${SGLANG_JIT_PATH:-.whl/sglang_jit}/SOURCE.txt" 2>/dev/null ||
        echo 'not fetched (benchmarks/fetch_sglang_jit.sh)')"
    echo "sglang compat suite: $(head -1 .whl/sglang_jit-0.5.13/SOURCE.txt 2>/dev/null ||
        echo 'no .whl/sglang_jit-0.5.13 (SGLANG_VERSION=0.5.13 benchmarks/fetch_sglang_jit.sh .whl/sglang_jit-0.5.13)')"
    return "$install_rc"
}

LIMIT="" run_step env env_info  # a shell function: timeout(1) cannot run it

for step in "$@"; do
    LIMIT="$STEP_TIMEOUT"
    if [[ "$step" =~ ^@([0-9]+):(.*)$ ]]; then
        LIMIT="${BASH_REMATCH[1]}"
        step="${BASH_REMATCH[2]}"
    fi
    case "$step" in
        tests) run_step "$step" python3 -m pytest -x -q -p no:cacheprovider tests/ -m "not slow" ;;
        tests:*) run_step "$step" python3 -m pytest -x -q -p no:cacheprovider tests/ -m "not slow" -k "${step#tests:}" ;;
        pytest:*)
            # ARGS split as the shell splits words, so quotes group them: pytest:-k 'cuda or prebuild'
            eval "pytest_args=(${step#pytest:})"
            run_step "$step" python3 -m pytest -p no:cacheprovider "${pytest_args[@]}"
            ;;
        ceiling) run_step "$step" python3 benchmarks/harness.py ;;
        bench:*)
            spec="${step#bench:}"
            fam="${spec%%:*}"
            extra=""
            [[ "$spec" == *:* ]] && extra="${spec#*:}"
            if [[ -f "benchmarks/bench_${fam}.py" ]]; then
                # shellcheck disable=SC2086
                run_step "$step" python3 "benchmarks/bench_${fam}.py" $extra
            else
                run_step "$step" bash -c "echo 'no such script: benchmarks/bench_${fam}.py'; exit 2"
            fi
            ;;
        grid:*)
            # A family's grid over several calls: records in GRID_grid/FAMILY.json of the results
            # folder (--resume times only what it lacks: carry it back into the tree between
            # calls); no case starts within 90 s of the step's limit, so the tables get written.
            spec="${step#grid:}"
            fam="${spec%%:*}"
            grid=models
            [[ "$spec" == *:* ]] && grid="${spec#*:}"
            grid_dir="$(results_dir)/${grid}_grid"
            mkdir -p "$grid_dir"
            budget=()
            [[ -n "$LIMIT" ]] && budget=(--budget "$((LIMIT - 90))")
            run_step "$step" python3 "benchmarks/bench_${fam}.py" --grid "$grid" --without torch --precompile 12 \
                --rep 10 --json "$grid_dir/$fam.json" --resume --out "$grid_dir" "${budget[@]}"
            ;;
        build) run_step "$step" sgljit build --backend cuda --cases --jobs 16 ;;
        verdict)
            run_step "$step" bash -c 'runs=("$1"/*_grid/*.json); [[ -e "${runs[0]}" ]] ||
                { echo "no grid records in $1"; exit 2; }; python3 benchmarks/verdict.py "${runs[@]}" --out "$1/verdict.md"' \
                _ "$(results_dir)"
            ;;
        jit) run_step "$step" python3 benchmarks/bench_jit.py ;;
        jit:*)
            # shellcheck disable=SC2086
            run_step "$step" python3 benchmarks/bench_jit.py ${step#jit:}
            ;;
        check) run_step "$step" sgljit check ;;
        memcheck)
            # Builds first, in parallel and outside the sanitizer (building every family's case
            # modules one after another through pytest probably took most of the step's limit on a
            # fresh machine), so the sanitized run only loads modules. Only sgljit's kernels are
            # checked (kns=sgljit: every kernel lives in an sgljit namespace): checking all of
            # torch's as well did not finish within 380 s.
            run_step "$step" bash -c 'sgljit build --backend cuda --cases --jobs 16 >/dev/null 2>&1; compute-sanitizer --tool memcheck --kernel-name kns=sgljit --error-exitcode 1 --print-limit 20 python3 -m pytest -q -p no:cacheprovider tests/plugins/test_conformance.py -k "cuda and numerics"'
            ;;
        sh:*) run_step "$step" bash -c "${step#sh:}" ;;
        *) run_step "$step" bash -c "echo 'unknown step: $step'; exit 2" ;;
    esac
done

pack
failed=0
for s in "${STATUS[@]}"; do [[ "$s" == ok ]] || failed=1; done
log ""
log "======== summary ========"
tee -a "$LOG" <"$SUMMARY"
exit "$failed"
