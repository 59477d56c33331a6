#!/usr/bin/env bash
# The release and CI tools in their own venv, build/release-tools (never in the
# test venv): scripts/requirements-release.txt (cyclonedx-py, zizmor) with uv.
# Prints the venv's bin/. Idempotent (stamp).
source "$(dirname "$0")/lib.sh"

tools=${FORK_RELEASE_TOOLS:-$ROOT/build/release-tools}
[ -x "$VENV/bin/uv" ] || die "no uv in $VENV: run scripts/setup_venv.sh first"
want=$({ cat "$ROOT/scripts/requirements-release.txt"; } | sha256sum | cut -d' ' -f1)
if [ "$(cat "$tools/.fork-stamp" 2>/dev/null)" != "$want" ]; then
    log "release tools: installing into $tools"
    rm -rf "$tools"
    "$VENV/bin/uv" venv -q --python "$("$PY" -c 'import sys; print(sys._base_executable)')" "$tools"
    "$VENV/bin/uv" pip install -q --python "$tools/bin/python" -r "$ROOT/scripts/requirements-release.txt"
    echo "$want" >"$tools/.fork-stamp"
fi
echo "$tools/bin"
