#!/usr/bin/env bash
# The main job: fetch and verify the pinned vLLM, apply the series, build a
# working vLLM (CPU kernels from the pinned wheel) and smoke-check it.
# Pass --reset to discard local edits in upstream/vllm (see apply_series.sh).
# A series that changes compiled sources (csrc/, cmake/, CMakeLists.txt,
# setup.py) is refused before anything runs, unless FORK_BUILD_KERNELS=1 builds
# the CPU kernels from source (scripts/install_vllm.sh).
source "$(dirname "$0")/lib.sh"

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
