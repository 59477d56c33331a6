#!/usr/bin/env bash
# Write what a maintainer pastes into GitHub to send upstream-pr/ to vLLM:
#
#   FORK_BASE=0.33.0 scripts/export_upstream_pr.sh [OUT]   (default build/upstream-pr)
#
# 0.33.0 (upstream-pr/0.33.0/, the newest release) is the base the PR is sent
# on; FORK_BASE=0.32.0 exports the same commits on 0.32.0.
#
#   OUT/NNNN-*.patch    the branch as `git format-patch`, with a cover letter,
#                       without the fork's rebase trailers (Origin, ...)
#   OUT/PR.md           the PR description in the base's own template
#                       (.github/PULL_REQUEST_TEMPLATE.md), its numbers measured
#                       on the base: bench/results/<base>/summary.json (stock vs
#                       stock + series, one run), the series' replay_cases.md,
#                       and the test command's JUnit reports when present
#   OUT/prs/NNNN.md     one PR description per commit, to send each as a PR
#                       of its own (upstream-pr/stack.md: the order and the
#                       1-2 line overviews)
#
# The narrative lives in upstream-pr/description.md (one section per template
# heading); scripts/render_pr_description.py fills in the measured tables.
source "$(dirname "$0")/lib.sh"

[ "$VLLM_VERSION" != "$PIN_VERSION" ] || die "the PR series is sent on a newer base: FORK_BASE=<version> (e.g. 0.32.0)"
out=${1:-$ROOT/build/upstream-pr}
"$ROOT/scripts/apply_series.sh"
n=$(series_entries | wc -l)
[ "$n" -gt 0 ] || die "$PATCHES/series lists no patches"

rm -rf "$out"
mkdir -p "$out"
# Cover letter: the PR title as subject, its overview as the blurb, from
# the patches' author.
author=$(sed -n 's/^From: //p' "$PATCHES/$(series_entries | head -n 1)" | head -n 1)
name=${author% <*} email=${author##*<}
GIT_AUTHOR_NAME=$name GIT_AUTHOR_EMAIL=${email%>} GIT_COMMITTER_NAME=$name GIT_COMMITTER_EMAIL=${email%>} \
    tgit -c core.abbrev=12 format-patch -q --cover-letter --zero-commit --no-signature \
    --cover-from-description=subject -o "$out" "$BASE_TAG..HEAD"
# The rebase trailers are the fork's bookkeeping, not upstream's: drop them
# from the messages (everything before the first "---").
sed -i '1,/^---$/{/^\(Origin\|Upstream-Status\|Forwarded\): /d}' "$out"/0*.patch
"$PY" "$ROOT/scripts/render_pr_description.py" --base "$VLLM_VERSION" --tree "$TREE" \
    --description "$ROOT/upstream-pr/description.md" --replay-cases "$PATCHES/replay_cases.md" \
    --results "$ROOT/build/test-results" \
    --out "$out/PR.md" --cover "$out/cover.txt" \
    --stack "$ROOT/upstream-pr/stack.md" --patches "$out" --prs "$out/prs"
"$PY" - "$out/0000-cover-letter.patch" "$out/cover.txt" <<'PYEOF'
import sys
from pathlib import Path
letter, cover = Path(sys.argv[1]), Path(sys.argv[2]).read_text()
title, _, blurb = cover.partition("\n\n")
text = letter.read_text().replace("*** SUBJECT HERE ***", title.strip(), 1)
letter.write_text(text.replace("*** BLURB HERE ***", blurb.strip(), 1))
PYEOF
rm "$out/cover.txt"
missing=$(grep -L '^Signed-off-by: ' "$out"/0*-*.patch | grep -v /0000-cover-letter.patch || true)
[ -z "$missing" ] || die "exported patches without a Signed-off-by: $missing"
log "export: $n patches + cover letter, PR.md and prs/ (one per commit) in $out"
ls -1 "$out" >&2
