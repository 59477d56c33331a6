#!/usr/bin/env bash
# Check the patch series without touching upstream/vllm's checkout:
# every series entry exists, no patch file is left out of the series, each patch
# carries a Subject, a Signed-off-by of its author (DCO) and the rebase trailers (Origin,
# Upstream-Status, Forwarded; a patch under the series' "(b)" heading names the
# upstream PR it backports in Origin and the release that has it in Drop-At;
# the patches under "(c)" are upstream-pr/'s commits, message for message),
# new Python files carry an SPDX header, and each patch, applied in order on
# the base in a scratch worktree, passes ruff (check and format) under the
# pinned tree's own config on the files it touches, and no patch changes
# compiled sources unless FORK_BUILD_KERNELS=1 (lib.sh).
#
#   scripts/check_series.sh [--precommit | --precommit-at-end]
#
# --precommit also runs vLLM's other pre-commit checks on each patch's touched
# files, as vLLM's .pre-commit-config.yaml runs them: mypy through the tree's
# tools/pre_commit/mypy.py and typos (pinned in scripts/requirements-release.txt).
# --precommit-at-end runs them once, after the last patch, on every file the
# series touches: a moved pin's rehearsal, where mypy follows vLLM's imports
# and takes 20-45 s a patch (the pin's series and upstream-pr/ run it per patch).
source "$(dirname "$0")/lib.sh"

precommit=0
case "${1:-}" in
--precommit) precommit=1 ;;
--precommit-at-end) precommit=2 ;;
"") ;;
*) die "usage: $0 [--precommit | --precommit-at-end]" ;;
esac

[ -d "$TREE/.git" ] || die "$TREE is not fetched yet: run scripts/fetch_upstream.sh"
ruff=$VENV/bin/ruff
[ -x "$ruff" ] || die "ruff is not installed in $VENV: run scripts/install_vllm.sh"

errors=()
mapfile -t entries < <(series_entries)
for p in "${entries[@]}"; do
    [ -f "$PATCHES/$p" ] || errors+=("$p: named in series but missing")
done
for f in "$PATCHES"/*.patch; do
    [ -e "$f" ] || continue
    printf '%s\n' "${entries[@]}" | grep -qxF "$(basename "$f")" ||
        errors+=("$(basename "$f"): not listed in series (orphan)")
done
[ "$(printf '%s\n' "${entries[@]}" | sort | uniq -d)" = "" ] || errors+=("series lists a patch twice")

for p in "${entries[@]}"; do
    f=$PATCHES/$p
    [ -f "$f" ] || continue
    grep -q '^Subject: ..*' "$f" || errors+=("$p: no Subject")
    # Trailers live in the message, before the first diff.
    msg=$(sed '/^---$/q' "$f")
    for trailer in Signed-off-by Origin Upstream-Status Forwarded; do
        grep -q "^$trailer: ..*" <<<"$msg" || errors+=("$p: no $trailer: trailer")
    done
    # A backport names the merged upstream PR it carries (DEP-3 Origin).
    if [ "$(series_block "$p")" = b ] &&
        ! grep -q '^Origin: backport, https://github.com/vllm-project/vllm/pull/[0-9]' <<<"$msg"; then
        errors+=("$p: in block (b) (backports) but its Origin: is not 'backport, <upstream PR URL>'")
    fi
    # Drop-At: the first release that has the change (scripts/move_pin.sh
    # drops the patch there); a backport always has one.
    drop_at=$(sed -n 's/^Drop-At: //p' <<<"$msg")
    if [ -n "$drop_at" ] && ! grep -qE '^[0-9]+\.[0-9]+\.[0-9]+$' <<<"$drop_at"; then
        errors+=("$p: Drop-At: '$drop_at' is not a release (X.Y.Z)")
    elif [ -z "$drop_at" ] && [ "$(series_block "$p")" = b ]; then
        errors+=("$p: in block (b) (backports) but has no Drop-At: <release> trailer")
    fi
    # A commit of the upstream PR series named in the message exists there
    # (adding a commit to upstream-pr/ renumbers the ones after it).
    for ref in $(grep -oE 'upstream-pr/[0-9]{4}' <<<"$msg" | sort -u); do
        compgen -G "$ROOT/$ref-*.patch" >/dev/null ||
            errors+=("$p: names $ref, which is not a commit of upstream-pr/")
    done
    # DCO: the author signs off. The author as git am reads it (a folded
    # From: header would otherwise pass on its first line).
    author=$(git mailinfo /dev/null /dev/null <"$f" | sed -n 's/^Author: //p; s/^Email: \(.*\)/<\1>/p' | paste -sd' ')
    grep -qxF "Signed-off-by: $author" <<<"$msg" ||
        errors+=("$p: the author ($author) has no Signed-off-by: line")
done

# Block (c) is upstream-pr/ backported: the same commits in the same order,
# each with the PR commit's subject and body (the trailers aside; a backport
# says in Backport-Notes: what differs on this base).
# message_of PATCH: its subject and body without the trailing trailer lines.
message_of() {
    local body
    body=$(mktemp)
    git mailinfo "$body" /dev/null <"$1" | sed -n 's/^Subject: //p'
    sed '/^---$/q' "$body" | awk '{ line[NR] = $0 } END {
        n = NR
        while (n > 0 && (line[n] == "" || line[n] ~ /^(Origin|Upstream-Status|Forwarded|Signed-off-by|Backport-Notes|Drop-At): /)) n--
        for (i = 1; i <= n; i++) print line[i]
    }'
    rm -f "$body"
}
mapfile -t block_c < <(for p in "${entries[@]}"; do [ "$(series_block "$p")" != c ] || echo "$p"; done)
if [ ${#block_c[@]} -gt 0 ]; then
    pr_dir=$ROOT/upstream-pr
    mapfile -t pr_entries < <(sed 's/#.*//; /^[[:space:]]*$/d' "$pr_dir/series")
    [ ${#block_c[@]} = ${#pr_entries[@]} ] ||
        errors+=("block (c) has ${#block_c[@]} patches, upstream-pr/series ${#pr_entries[@]}: it is upstream-pr/ backported, commit for commit")
    for i in "${!block_c[@]}"; do
        [ -n "${pr_entries[$i]:-}" ] && [ -f "$PATCHES/${block_c[$i]}" ] || continue
        if [ "$(message_of "$PATCHES/${block_c[$i]}")" != "$(message_of "$pr_dir/${pr_entries[$i]}")" ]; then
            errors+=("${block_c[$i]}: its subject or body differs from upstream-pr/${pr_entries[$i]} (block (c) takes the PR commit's message; put what differs on this base in Backport-Notes:)")
        fi
    done
fi

# Compiled sources: the release's precompiled kernels would be stale.
while IFS= read -r touch; do
    [ -n "$touch" ] || continue
    if [ "${FORK_BUILD_KERNELS:-0}" = 1 ]; then
        log "series check: $touch changes compiled sources (kernels built from source: FORK_BUILD_KERNELS=1)"
    else
        errors+=("$touch: changes compiled sources, the precompiled $VLLM_VERSION kernels would be stale (set FORK_BUILD_KERNELS=1 to build the CPU kernels from source)")
    fi
done < <(compiled_source_touches)

if [ "$precommit" != 0 ]; then
    tools=$("$ROOT/scripts/setup_release_tools.sh")
    # mypy's cache survives between patches and runs (each patch adds a few files).
    export MYPY_CACHE_DIR=$ROOT/build/mypy-cache-$VLLM_VERSION
fi

# precommit_checks WHAT FILES...: mypy and typos in the scratch worktree.
precommit_checks() {
    local what=$1 out; shift
    log "series check: $what: mypy and typos on $# files"
    if ! out=$(cd "$wt" && PATH=$tools:$PATH "$tools/python" tools/pre_commit/mypy.py 3.11 "$@" 2>&1); then
        errors+=("$what: mypy:"$'\n'"$(grep -E 'error|Found' <<<"$out")")
    fi
    if ! out=$(cd "$wt" && "$tools/typos" --force-exclude "$@" 2>&1); then
        errors+=("$what: typos:"$'\n'"$out")
    fi
}

touched=()
if [ ${#errors[@]} -eq 0 ] && [ ${#entries[@]} -gt 0 ]; then
    wt=$(mktemp -d)/tree
    trap 'tgit worktree remove --force "$wt" >/dev/null 2>&1 || true; rm -rf "$(dirname "$wt")"' EXIT
    tgit worktree add -q --detach "$wt" "$BASE_TAG"
    for p in "${entries[@]}"; do
        if ! out=$(git -C "$wt" am --keep-non-patch --committer-date-is-author-date "$PATCHES/$p" 2>&1); then
            errors+=("$p: does not apply in order: $(grep -E '^(error|fatal)' <<<"$out" | head -n 3 || true)")
            break
        fi
        mapfile -t added < <(git -C "$wt" diff-tree -r --no-commit-id --name-only --diff-filter=A HEAD -- '*.py')
        for py in "${added[@]}"; do
            head -n 3 "$wt/$py" | grep -q 'SPDX-License-Identifier' || errors+=("$p: new file $py has no SPDX header")
        done
        mapfile -t pys < <(git -C "$wt" diff-tree -r --no-commit-id --name-only --diff-filter=ACMR HEAD -- '*.py')
        [ ${#pys[@]} -gt 0 ] || continue
        if ! out=$(cd "$wt" && "$ruff" check --no-cache --quiet "${pys[@]}" 2>&1); then
            errors+=("$p: ruff check:"$'\n'"$out")
        fi
        if ! out=$(cd "$wt" && "$ruff" format --no-cache --check --quiet "${pys[@]}" 2>&1); then
            errors+=("$p: ruff format:"$'\n'"$out")
        fi
        touched+=("${pys[@]}")
        [ "$precommit" = 1 ] || continue
        precommit_checks "$p" "${pys[@]}"
    done
    if [ "$precommit" = 2 ] && [ ${#errors[@]} -eq 0 ]; then
        mapfile -t pys < <(cd "$wt" && printf '%s\n' "${touched[@]}" | sort -u |
            while read -r f; do [ ! -e "$f" ] || echo "$f"; done)
        [ ${#pys[@]} -eq 0 ] || precommit_checks "the series (after its last patch)" "${pys[@]}"
    fi
fi

if [ ${#errors[@]} -gt 0 ]; then
    printf 'series check: %s\n' "${errors[@]}" >&2
    exit 1
fi
checks="entries, trailers, apply in order, ruff"
[ "$precommit" != 1 ] || checks+=", mypy, typos"
[ "$precommit" != 2 ] || checks+=", mypy and typos after the last patch"
log "series check: ${#entries[@]} patches OK ($checks)"
