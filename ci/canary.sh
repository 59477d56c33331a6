#!/usr/bin/env bash
# ci/canary.sh [VERSION]: apply patches/series to the newest vLLM release (or
# VERSION) from its sdist, each patch in order with a 3-way fallback; report
# per patch "applies", "applies (3-way)" or "FAILS" with its Upstream-Status.
# Exits 1 if any patch fails. Works in build/canary; touches nothing else.
source "$(dirname "$0")/../scripts/lib.sh"

"$ROOT/scripts/setup_venv.sh"
work=$ROOT/build/canary
rm -rf "$work"
mkdir -p "$work/dl"
version=${1:-$("$PY" -m pip index versions vllm 2>/dev/null | sed -n 's/^vllm (\(.*\))$/\1/p')}
[ -n "$version" ] || die "could not find the newest vLLM release (pip index versions vllm)"
log "canary: fetching the sdist of vLLM $version (pinned: $VLLM_VERSION)"
# pip prepares the sdist's metadata to download it: no device, a plain version.
VLLM_TARGET_DEVICE=empty CARGO=false VLLM_VERSION_OVERRIDE=$version \
    "$PY" -m pip download -q --no-deps --no-binary :all: --no-build-isolation \
    "vllm==$version" -d "$work/dl"
sdist=$(ls "$work"/dl/vllm-*.tar.gz)
tar --no-same-owner -xzf "$sdist" -C "$work"
src=$work/vllm-$version
git -C "$src" init -q
git -C "$src" add -A -f
git -C "$src" commit -q -m "vLLM $version release sdist"
failed=0
while read -r p; do
    status=$(sed -n 's/^Upstream-Status: //p' "$PATCHES/$p" | head -n 1)
    if git -C "$src" am -q --keep-non-patch "$PATCHES/$p" 2>/dev/null; then
        echo "applies          $p  ($status)"
    elif git -C "$src" am --abort && git -C "$src" am -q -3 --keep-non-patch "$PATCHES/$p" 2>/dev/null; then
        echo "applies (3-way)  $p  ($status)"
    else
        git -C "$src" am --abort 2>/dev/null || true
        echo "FAILS            $p  ($status)"
        failed=1
    fi
done < <(series_entries)
[ "$failed" = 0 ] || die "the series does not apply to vLLM $version as is: rebase it (README: Working on the series)"
log "canary: the series applies to vLLM $version"
