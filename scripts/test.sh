#!/usr/bin/env bash
# The test command. In order: the toolchain tests, the build if needed
# (scripts/apply_and_build.sh), the upstream suites from the patched tree
# (tests/upstream_suites.txt minus tests/upstream_deselect.txt), our
# regression tests (incl. the store benchmark's --quick invariants), the
# end-to-end engine tests, then the wheels (scripts/build_wheels.sh) and their
# release tests (the CPU wheel in a fresh venv serving, the CUDA wheel's
# contents, the warm rebuild). Ends with one line "N passed, N failed".
#
#   scripts/test.sh          everything (what CI runs)
#   scripts/test.sh --fast   without the end-to-end engine tests (marker e2e)
source "$(dirname "$0")/lib.sh"

fast=0
case "${1:-}" in
--fast) fast=1 ;;
"") ;;
*) die "usage: $0 [--fast]" ;;
esac

results=$ROOT/build/test-results
rm -rf "$results"
mkdir -p "$results"
reports=()

# run_suite NAME DIR PYTEST_ARGS...: one pytest process, its JUnit report kept.
run_suite() {
    local name=$1 dir=$2; shift 2
    log "== suite $name"
    reports+=("$results/$name.xml")
    (cd "$dir" && "$PY" -m pytest -p no:cacheprovider -q -o junit_family=xunit1 \
        --junitxml="$results/$name.xml" "$@") || true
}

# Hub access is impossible here: serve the config-only model files committed
# under tests/fixtures/hf/ (ORG--NAME/) from an offline cache.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HOME=$ROOT/build/hf-home
rm -rf "$HF_HOME"
for model in "$ROOT"/tests/fixtures/hf/*/; do
    repo=$(basename "$model")
    snap=$HF_HOME/hub/models--$repo/snapshots/0000000000000000000000000000000000000000
    mkdir -p "$snap" "$HF_HOME/hub/models--$repo/refs"
    cp "$model"* "$snap/"
    # The hub client reads this file verbatim: no trailing newline.
    printf %s 0000000000000000000000000000000000000000 >"$HF_HOME/hub/models--$repo/refs/main"
done

"$ROOT/scripts/setup_venv.sh"
"$ROOT/scripts/fetch_upstream.sh"
run_suite toolchain "$ROOT" tests/toolchain

log "== build"
"$ROOT/scripts/apply_and_build.sh"

deselect=()
while IFS= read -r line; do
    entry=$(sed -e 's/#.*//' -e 's/[[:space:]]*$//' <<<"$line")
    [ -n "$entry" ] || continue
    grep -q '#[[:space:]]*[^[:space:]]' <<<"$line" || die "tests/upstream_deselect.txt: $entry has no reason"
    deselect+=(--deselect "$entry")
done <"$ROOT/tests/upstream_deselect.txt"
mapfile -t suites < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$ROOT/tests/upstream_suites.txt")
run_suite upstream "$TREE" "${suites[@]}" "${deselect[@]}"

markers=()
[ "$fast" = 0 ] || markers=(-m "not e2e")
run_suite regression "$ROOT" tests/regression "${markers[@]}"
# Real engines on the CPU platform with the host-copy offloading spec.
[ "$fast" = 1 ] || run_suite e2e "$ROOT" tests/e2e

log "== wheels"
t0=$(date +%s)
"$ROOT/scripts/build_wheels.sh"
log "wheels: built or checked in $(($(date +%s) - t0)) s"
# --fast: the wheels' contents and the warm rebuild, not the server.
run_suite release "$ROOT" tests/release "${markers[@]}"

log "== summary"
"$PY" "$ROOT/scripts/summarize_tests.py" "${reports[@]}"
