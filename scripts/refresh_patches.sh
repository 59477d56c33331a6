#!/usr/bin/env bash
# Export the commits on top of the base in upstream/vllm back into patches/ and
# patches/series. Apply-then-refresh of an unchanged series is byte-identical.
#
# Workflow: scripts/apply_series.sh; commit (or `git rebase -i v0.29.0`) in
# upstream/vllm; scripts/refresh_patches.sh; review `git diff patches/`.
source "$(dirname "$0")/lib.sh"

[ -d "$TREE/.git" ] || die "$TREE is not fetched yet: run scripts/fetch_upstream.sh"
[ -z "$(tgit status --porcelain)" ] || die "$TREE has uncommitted changes: commit them first"
tgit merge-base --is-ancestor "$BASE_TAG" HEAD || die "HEAD of $TREE does not descend from $BASE_TAG"

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# Pinned options keep the files stable: no sha (it changes on every am), no
# git version signature, no "n/m" in subjects, fixed abbreviation length.
tgit -c core.abbrev=12 -c diff.noprefix=false format-patch -q --zero-commit \
    --no-signature --no-numbered -o "$out" "$BASE_TAG..HEAD"

# The series file's comment lines (its header and the headings of its blocks)
# stay where they are: the n-th patch takes the n-th entry's place. A patch
# added or dropped moves the entries after it; check the headings then. A
# series without comments gets the default header.
mapfile -t new_names < <(cd "$out" && ls -1 -- *.patch 2>/dev/null || true)
if grep -q '^#' "$PATCHES/series" 2>/dev/null; then
    awk -v names="${new_names[*]}" '
        BEGIN { n = split(names, name, " ") }
        { entry = $0; sub(/#.*/, "", entry); gsub(/[[:space:]]/, "", entry) }
        entry == "" { print; next }
        { if (++k <= n) print name[k] }
        END { for (k++; k <= n; k++) print name[k] }
    ' "$PATCHES/series" >"$out/series"
    old_count=$(series_entries | wc -l)
    [ "$old_count" = "${#new_names[@]}" ] ||
        log "refresh: $old_count patches before, ${#new_names[@]} now: check that each sits under its heading in patches/series"
else
    {
        echo "# The patch series, applied in this order on the pinned base (upstream/vllm.lock)."
        echo "# One file name a line; maintained by scripts/refresh_patches.sh."
        printf '%s\n' "${new_names[@]}"
    } >"$out/series"
fi

# Replace the old series' files with the new ones.
mkdir -p "$PATCHES"
series_entries | while read -r p; do rm -f "$PATCHES/$p"; done
cp "$out"/*.patch "$PATCHES/" 2>/dev/null || true
cp "$out/series" "$PATCHES/series"

echo "$(series_fingerprint) $(tgit rev-parse HEAD)" >"$TREE/.git/fork-series"
log "refresh: $(series_entries | wc -l) patches written to $PATCHES"
