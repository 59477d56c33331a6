#!/usr/bin/env bash
# install_wheel.sh VENV WHEEL: a fresh virtual environment VENV (removed first)
# with the fork's CPU wheel installed as a user installs it (not editable),
# and its runtime requirements. The requirements are the wheel's own
# Requires-Dist, resolved with uv at the versions the test venv holds
# (constraints), so they come from the local caches, not another download;
# torchaudio / torchvision / torchcodec are left out as in install_vllm.sh (the
# registry's builds do not load against torch 2.13.0+cpu, nothing needs them).
source "$(dirname "$0")/lib.sh"

[ $# = 2 ] || die "usage: $0 VENV WHEEL"
target=$1 wheel=$2
[ -f "$wheel" ] || die "no wheel $wheel"
uv=$VENV/bin/uv
[ -x "$uv" ] || die "no uv in $VENV: run scripts/setup_venv.sh first"

log "install wheel: fresh venv $target with $(basename "$wheel")"
rm -rf "$target"
"$uv" venv -q --python "$("$PY" -c 'import sys; print(sys._base_executable)')" "$target"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PY" - "$wheel" >"$work/requirements.txt" <<'PYEOF'
import re, sys, zipfile
from email.parser import Parser
with zipfile.ZipFile(sys.argv[1]) as zf:
    meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
    msg = Parser().parsestr(zf.read(meta).decode())
for req in msg.get_all("Requires-Dist") or []:
    if "extra ==" in req or re.match(r"torch(audio|vision|codec)\b", req):
        continue
    print(req)
PYEOF
"$uv" pip freeze -q --python "$PY" --exclude-editable | grep -v '^vllm' >"$work/constraints.txt"
# torch's +cpu build comes from where pip finds it on this machine.
links=()
for l in ${PIP_FIND_LINKS:-} $("$PY" -m pip config get global.find-links 2>/dev/null || true); do
    links+=(--find-links "$l")
done
"$uv" pip install -q --python "$target/bin/python" "${links[@]}" \
    -r "$work/requirements.txt" -c "$work/constraints.txt"
"$uv" pip install -q --python "$target/bin/python" --no-deps "$wheel"
log "install wheel: $("$target/bin/python" -c 'from importlib.metadata import version; print("vllm", version("vllm"))') in $target"
