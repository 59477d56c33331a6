#!/usr/bin/env bash
# Move the pin: make the fork's series for another vLLM release from the
# blocks of patches/series, then apply and build it on that release.
#
#   scripts/move_pin.sh VERSION [--no-build] [--out DIR]
#
# Writes build/pin-VERSION/patches/ (or DIR: a series file in the same blocks,
# and its patches) and says, patch by patch, what it took and why:
#   (a), (b), (d): a patch whose Drop-At: trailer names VERSION or an earlier
#     release is dropped (upstream has it). A patch listed in
#     patches/port-VERSION/dropped is dropped for the reason given there.
#     Otherwise the hand port patches/port-VERSION/<same file name> is taken
#     where one exists, else the pin's patch as it is.
#   (c): upstream-pr/ for VERSION (its rebase upstream-pr/VERSION/ where one
#     exists), the same commits as the PR.
# Then, unless --no-build, applies and builds it on VERSION
# (FORK_BASE=VERSION FORK_PATCHES=build/pin-VERSION/patches
# scripts/apply_and_build.sh): a patch that does not apply is named and the
# tree goes back to the base. The pin itself does not move: patches/ is read,
# never written.
source "$(dirname "$0")/lib.sh"
# The pin's series is the input (FORK_PATCHES may point at a copy of it).
[ -z "${FORK_BASE:-}" ] || [ "$FORK_BASE" = "$PIN_VERSION" ] ||
    die "FORK_BASE=$FORK_BASE: move_pin.sh reads the pin's series; give the target as its argument"

usage="usage: $0 VERSION [--no-build] [--out DIR]"
version=${1:-}
[ -n "$version" ] && [ "${version#-}" = "$version" ] || die "$usage"
shift
build=1 out=$ROOT/build/pin-$version/patches
while [ $# -gt 0 ]; do
    case "$1" in
    --no-build) build=0 ;;
    --out) [ -n "${2:-}" ] || die "$usage"; out=$2; shift ;;
    *) die "$usage" ;;
    esac
    shift
done
[ "$version" != "$PIN_VERSION" ] || die "$version is the pin already"
[ -f "$ROOT/upstream/vllm-$version.lock" ] || die "vLLM $version has no lock (upstream/vllm-$version.lock); available bases: $(available_bases)"

pin_patches=$PATCHES
port=$pin_patches/port-$version
pr=$(FORK_BASE=$version FORK_PATCHES= FORK_SERIES_SAID=1 bash -c 'source "$1/scripts/lib.sh"; echo "$PATCHES"' _ "$ROOT")
[ -f "$pr/series" ] || die "no upstream PR series for vLLM $version ($pr/series)"

# trailer PATCH NAME: the value of the message's NAME: trailer (empty if none).
trailer() { sed '/^---$/q' "$1" | sed -n "s/^$2: //p" | head -n 1; }
# version_le A B: A is B or an earlier release.
version_le() { [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n 1)" = "$1" ]; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
series=$tmp/series
{
    echo "# The fork's series on vLLM $version, made by scripts/move_pin.sh from"
    echo "# patches/series (pin $PIN_VERSION); do not edit: edit the pin's series, its"
    echo "# ports (patches/port-$version/) or upstream-pr/, and run it again."
} >"$series"

block= pr_taken=0 kept=0 dropped=0 replaced=0
take() { # take FILE LABEL: copy FILE into the series
    local name
    name=$(basename "$1")
    [ ! -e "$tmp/$name" ] || die "two patches named $name in the moved series"
    cp "$1" "$tmp/$name"
    echo "$name" >>"$series"
    printf '  %-6s %s (%s)\n' take "$name" "$2" >&2
    kept=$((kept + 1))
}
say_drop() { # say_drop NAME REASON
    printf '  %-6s %s: %s\n' drop "$1" "$2" >&2
    dropped=$((dropped + 1))
}

log "move: the fork's series on vLLM $version from patches/series (pin $PIN_VERSION)"
while read -r entry; do
    b=$(series_block "$entry")
    if [ "$b" != "$block" ]; then
        block=$b
        printf '\n# (%s)\n' "$block" >>"$series"
        echo "(${block:-?})" >&2
    fi
    if [ "$block" = c ]; then
        # The block is upstream-pr/ as a whole: the same commits as the PR.
        if [ "$pr_taken" = 0 ]; then
            pr_taken=1
            while read -r p; do
                take "$pr/$p" "${pr#"$ROOT"/}/"
            done < <(sed -e 's/#.*//' -e 's/[[:space:]]*$//' "$pr/series" | grep -v '^$')
        fi
        printf '  %-6s %s (replaced by %s)\n' drop "$entry" "${pr#"$ROOT"/}/" >&2
        replaced=$((replaced + 1))
        continue
    fi
    f=$pin_patches/$entry
    drop_at=$(trailer "$f" Drop-At)
    if [ -n "$drop_at" ] && version_le "$drop_at" "$version"; then
        say_drop "$entry" "Drop-At: $drop_at ($(trailer "$f" Upstream-Status))"
        continue
    fi
    reason=$(awk -v e="$entry" '$1 == e { $1 = ""; sub(/^ +/, ""); print; exit }' "$port/dropped" 2>/dev/null || true)
    if [ -n "$reason" ]; then
        say_drop "$entry" "$reason"
    elif [ -f "$port/$entry" ]; then
        take "$port/$entry" "ported: ${port#"$ROOT"/}/"
    else
        take "$f" "as on the pin"
    fi
done < <(series_entries)

# Replace only what an earlier run wrote (a series file), or nothing.
[ ! -e "$out" ] || [ -f "$out/series" ] || [ -z "$(ls -A "$out")" ] ||
    die "$out exists and holds no series: not replacing it"
rm -rf "$out"
mkdir -p "$(dirname "$out")"
mv "$tmp" "$out"
trap - EXIT
log "move: $kept patches in ${out#"$ROOT"/}/series; of the pin's, $dropped dropped and $replaced replaced by ${pr#"$ROOT"/}/"

[ "$build" = 1 ] || exit 0
env -u FORK_TREE -u FORK_LOCK -u FORK_VENV FORK_BASE="$version" FORK_PATCHES="$out" \
    "$ROOT/scripts/apply_and_build.sh"
