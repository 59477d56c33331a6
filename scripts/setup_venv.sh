#!/usr/bin/env bash
# Create the virtual environment with the pinned torch and the build tools.
# Idempotent: a stamp records what was installed; nothing changed -> nothing done.
# The torch is the lock's TORCH_VERSION, or TORCH_INSTALL_VERSION where the lock
# sets one (the release's torch is not on this machine: a stated substitute).
source "$(dirname "$0")/lib.sh"

want=$(cat "$ROOT/scripts/requirements-build.txt" "$LOCK" | sha256sum | cut -d' ' -f1)
stamp=$VENV/.fork-base-stamp
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$PY" -c 'import torch' 2>/dev/null; then
    log "venv: $VENV is up to date"
    exit 0
fi
torch=${TORCH_INSTALL_VERSION:-$TORCH_VERSION}
[ "$torch" = "$TORCH_VERSION" ] ||
    log "venv: vLLM $VLLM_VERSION pins torch $TORCH_VERSION; the lock installs $torch instead (TORCH_INSTALL_VERSION)"
log "venv: creating $VENV with torch==$torch and build tools"
[ -x "$PY" ] || python3 -m venv "$VENV"
"$PY" -m pip install --quiet --disable-pip-version-check "torch==$torch" \
    -r "$ROOT/scripts/requirements-build.txt"
"$PY" - "$torch" <<'PYEOF'
import sys, torch
want = sys.argv[1]
if torch.__version__.split("+")[0] != want:
    sys.exit(f"error: torch {torch.__version__} installed, the pin is {want}")
PYEOF
echo "$want" >"$stamp"
log "venv: ready ($("$PY" -c 'import torch; print("torch", torch.__version__)'))"
