#!/usr/bin/env bash
# Store-traffic benchmark (bench/): offload store bytes, the theoretical
# minimum, hits against a reference that stores every chunk and the
# scheduler-side CPU cost of the fork against stock vLLM 0.29.0 (both at the
# same GPU retention), on four model geometries, three workloads and engine
# variants. No GPU needed.
#
#   scripts/bench_store.sh           full run (~30 min): writes bench/results/
#   scripts/bench_store.sh --quick   CI check (~3 min): exits 1 on a violated invariant
#   scripts/bench_store.sh [--quick] ARGS...   ARGS go to `python -m bench.run`
#   FORK_BASE=0.32.0 scripts/bench_store.sh   stock 0.32.0 against 0.32.0 +
#                                    upstream-pr/: writes bench/results/0.32.0/
#
# Stock is the base release with an empty series, built by the same scripts
# into build/stock/vllm (build/stock-<version>/vllm for another base;
# idempotent) and imported through PYTHONPATH with the base's venv: the
# scheduler side needs no compiled kernels.
source "$(dirname "$0")/lib.sh"

# Anything else is passed to bench.run (e.g. --geometries ..., --repeats N).
mode=()
[ "${1:-}" != --quick ] || { mode=(--quick); shift; }
mode+=("$@")

[ -x "$PY" ] || die "no virtual environment at $VENV: run scripts/apply_and_build.sh first"
[ -f "$TREE/vllm/__init__.py" ] && [ -f "$VENV/.fork-vllm-stamp" ] ||
    die "the fork is not built ($TREE): run scripts/apply_and_build.sh first"

stock=$ROOT/build/stock out=$ROOT/bench/results
if [ "$VLLM_VERSION" != "$PIN_VERSION" ]; then
    stock=$ROOT/build/stock-$VLLM_VERSION out=$ROOT/bench/results/$VLLM_VERSION
fi
mkdir -p "$stock/patches"
[ -f "$stock/patches/series" ] || : >"$stock/patches/series"
log "bench: stock vLLM $VLLM_VERSION (empty series) in $stock/vllm"
FORK_PATCHES=$stock/patches FORK_TREE=$stock/vllm "$ROOT/scripts/fetch_upstream.sh"
FORK_PATCHES=$stock/patches FORK_TREE=$stock/vllm "$ROOT/scripts/apply_series.sh"

log "bench: running${mode:+ ${mode[*]}}"
cd "$ROOT"
# A tree imported from source picks the CPU platform by this (no +cpu wheel).
export VLLM_TARGET_DEVICE=cpu
exec "$PY" -m bench.run --stock-tree "$stock/vllm" --fork-tree "$TREE" \
    --out "$out" --series "${PATCHES#"$ROOT"/}/" "${mode[@]}"
