#!/usr/bin/env bash
# The GPU job (ci/workflows/gpu.yml), as a GPU machine runs it:
#   ci/gpu_tests.sh [CUDA_WHEEL]      (default: the fork's CUDA wheel in dist/)
# 1. the patched tree's tests/ (fetch + apply, as scripts/apply_and_build.sh);
# 2. a fresh venv with the fork's CUDA wheel and its requirements (registry);
# 3. the upstream tests tests/upstream_deselect.txt leaves out on CPU for want
#    of CUDA (every entry whose reason names CUDA or GPU; run with all their
#    parameters, which differ on CUDA);
# 4. ci/gpu/test_cuda_offload.py: a real engine with vLLM's own
#    CPUOffloadingSpec on a tiny hybrid model, store then reload.
# Results: build/gpu-results/*.xml. Exits non-zero on any failure or skip.
source "$(dirname "$0")/../scripts/lib.sh"

wheel=${1:-$(ls "$ROOT"/dist/vllm-*+fork.*-manylinux*.whl 2>/dev/null | grep -v '\.cpu-' | head -n 1)}
[ -n "$wheel" ] && [ -f "$wheel" ] || die "no CUDA wheel given and none in dist/ (scripts/build_wheels.sh)"
command -v nvidia-smi >/dev/null && nvidia-smi -L >&2 || die "no GPU here (nvidia-smi)"
work=$ROOT/build/gpu
results=$ROOT/build/gpu-results
rm -rf "$results"
mkdir -p "$work" "$results"

log "== gpu 1/4 patched tree (tests)"
"$ROOT/scripts/setup_venv.sh"
"$ROOT/scripts/fetch_upstream.sh"
"$ROOT/scripts/apply_series.sh"
# A copy of tests/ only: run from the tree, pytest would import the tree's
# vllm/ (no kernels) instead of the wheel.
rm -rf "$work/upstream"
mkdir -p "$work/upstream"
cp -a "$TREE/tests" "$work/upstream/tests"

log "== gpu 2/4 venv with $(basename "$wheel")"
gpu_venv=$work/venv
rm -rf "$gpu_venv"
"$VENV/bin/uv" venv -q --python "$("$PY" -c 'import sys; print(sys._base_executable)')" "$gpu_venv"
"$VENV/bin/uv" pip install -q --python "$gpu_venv/bin/python" "$wheel" -r "$ROOT/tests/requirements.txt"
"$gpu_venv/bin/vllm" --version
"$gpu_venv/bin/python" -c 'from importlib.metadata import distribution as d; print(d("vllm").read_text("fork_provenance.json"))'

log "== gpu 3/4 upstream tests deselected on CPU for want of CUDA"
mapfile -t nodes < <(grep -Ei '#.*(cuda|gpu)' "$ROOT/tests/upstream_deselect.txt" |
    sed -e 's/[[:space:]]*#.*//' -e 's/\[.*\]$//' | sort -u)
status=0
(cd "$work/upstream" && "$gpu_venv/bin/python" -m pytest -p no:cacheprovider -q \
    --junitxml="$results/upstream-cuda.xml" "${nodes[@]}") || status=1

log "== gpu 4/4 engine test: vLLM's CPUOffloadingSpec on a tiny hybrid model"
(cd "$ROOT" && PYTHONPATH=$ROOT/tests "$gpu_venv/bin/python" -m pytest -p no:cacheprovider -q \
    --junitxml="$results/cuda-offload.xml" ci/gpu/test_cuda_offload.py) || status=1

"$gpu_venv/bin/python" "$ROOT/scripts/summarize_tests.py" "$results"/*.xml || status=1
exit $status
