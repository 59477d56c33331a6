#!/usr/bin/env bash
# Apply patches/series with `git am` on the pinned base in upstream/vllm.
#
#   scripts/apply_series.sh [--reset]
#
# Same series already applied and nothing edited: nothing to do. Series changed:
# back to the base, apply again. A patch that fails is named with the failing
# hunk and the tree goes back to the base (nothing half-applied). A tree that
# is not the pinned base, has local edits, or has commits that are not the
# applied series is refused; --reset discards those and starts from the base.
source "$(dirname "$0")/lib.sh"

reset=0
case "${1:-}" in
--reset) reset=1 ;;
"") ;;
*) die "usage: $0 [--reset]" ;;
esac

[ -d "$TREE/.git" ] || die "$TREE is not fetched yet: run scripts/fetch_upstream.sh"

# The base must be the pinned release, byte for byte.
if [ "$(tgit rev-parse -q --verify "refs/tags/$BASE_TAG^{tree}" 2>/dev/null)" != "$VLLM_BASE_TREE" ]; then
    found=$(sed -n 's/^Version: //p' "$TREE/PKG-INFO" 2>/dev/null || true)
    msg="$TREE is not the pinned vLLM $VLLM_VERSION base (tag $BASE_TAG missing or its tree differs; PKG-INFO says ${found:-nothing})"
    [ "$reset" = 1 ] || die "$msg; rerun with --reset to unpack the pinned release again"
    log "apply: $msg; unpacking the pinned release again (--reset)"
    rm -rf "$TREE"
    "$ROOT/scripts/fetch_upstream.sh"
fi

# State of the last apply: "<series fingerprint> <HEAD>" or "pending" while applying.
state=$TREE/.git/fork-series
recorded=$(cat "$state" 2>/dev/null || true)
base=$(tgit rev-parse "$BASE_TAG^{commit}")
problems=()
if [ "$recorded" != pending ]; then
    [ ! -d "$TREE/.git/rebase-apply" ] || problems+=("a git am is in progress")
    dirty=$(tgit status --porcelain | head -n 5)
    [ -z "$dirty" ] || problems+=("local edits:"$'\n'"$dirty")
    expected_head=${recorded#* }
    [ -n "$recorded" ] || expected_head=$base
    [ "$(tgit rev-parse HEAD)" = "$expected_head" ] ||
        problems+=("HEAD $(tgit rev-parse --short HEAD) is not the applied series (commits of your own? export them with scripts/refresh_patches.sh)")
fi
if [ ${#problems[@]} -gt 0 ]; then
    msg=$(printf '%s\n' "${problems[@]}")
    [ "$reset" = 1 ] || die "$TREE is not the pinned base plus the series:"$'\n'"$msg"$'\n'"rerun with --reset to discard this"
    log "apply: discarding (--reset): $msg"
fi

fingerprint=$(series_fingerprint)
mapfile -t entries < <(series_entries)
if [ ${#problems[@]} -eq 0 ] && [ "$recorded" = "$fingerprint $(tgit rev-parse HEAD)" ]; then
    log "apply: series already applied (${#entries[@]} patches), nothing to do"
    exit 0
fi
for p in "${entries[@]}"; do
    [ -f "$PATCHES/$p" ] || die "patches/series names $p, which does not exist"
done

back_to_base() {
    tgit am --abort >/dev/null 2>&1 || true
    tgit reset -q --hard "$base"
    tgit clean -q -fd
}
echo pending >"$state"
back_to_base
for p in "${entries[@]}"; do
    if ! out=$(tgit am --keep-non-patch --committer-date-is-author-date "$PATCHES/$p" 2>&1); then
        back_to_base
        rm -f "$state"
        printf '%s\n' "$out" | grep -E '^(error|Patch failed|fatal)' >&2 || printf '%s\n' "$out" >&2
        die "patch $p does not apply; $TREE is back at $BASE_TAG"
    fi
    log "apply: applied $p"
done
echo "$fingerprint $(tgit rev-parse HEAD)" >"$state"
log "apply: ${#entries[@]} patches applied on $BASE_TAG"
