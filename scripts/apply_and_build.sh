#!/usr/bin/env bash
# The main job: fetch and verify the pinned vLLM, apply the series, build a
# working vLLM (CPU kernels from the pinned wheel) and smoke-check it.
# Pass --reset to discard local edits in upstream/vllm (see apply_series.sh).
# A series that changes compiled sources (csrc/, cmake/, CMakeLists.txt,
# setup.py) is refused before anything runs, unless FORK_BUILD_KERNELS=1 builds
# the CPU kernels from source (scripts/install_vllm.sh).
source "$(dirname "$0")/lib.sh"

# Refuse a bad argument before the long steps, not at step 3.
case "${1:-}" in
"" | --reset) [ $# -le 1 ] || die "usage: $0 [--reset]" ;;
-h | --help) sed -n '2,7s/^# \{0,1\}//p' "$0"; echo "usage: $0 [--reset]"; exit 0 ;;
*) die "usage: $0 [--reset]" ;;
esac

mode=$(kernel_mode)
log "kernels: $mode"

log "== 1/5 virtual environment"
"$ROOT/scripts/setup_venv.sh"
log "== 2/5 fetch and verify vLLM $VLLM_VERSION"
"$ROOT/scripts/fetch_upstream.sh"
log "== 3/5 apply the patch series"
"$ROOT/scripts/apply_series.sh" "$@"
log "== 4/5 install"
"$ROOT/scripts/install_vllm.sh"
log "== 5/5 smoke check"
"$PY" "$ROOT/scripts/smoke_check.py" "$TREE" "$BASE_TAG"
log "done"
