#!/usr/bin/env bash
# Soak test: `vllm serve` (the fork, CPU platform, 127.0.0.1 only) under
# concurrent load with a CPU offload tier a few requests large, an engine KV
# cache small enough to preempt, client aborts, bad requests, an audit of the
# offload manager once idle and SIGTERM with requests in flight; every
# completed greedy request compared with an engine without the connector
# (bench/soak.py). Exits 1 when an assertion fails.
#
#   scripts/soak.sh --quick          one run, ~3 min (in the test command)
#   scripts/soak.sh [--minutes N]    six runs (Gemma-3-like and Mamba hybrid x
#                                    retention None / 0 / 512, LRU and ARC),
#                                    N minutes of load (default 24): writes
#                                    bench/results/soak.md
#   scripts/soak.sh ARGS...          ARGS go to `python -m bench.soak`
source "$(dirname "$0")/lib.sh"

[ -x "$PY" ] || die "no virtual environment at $VENV: run scripts/apply_and_build.sh first"
[ -f "$TREE/vllm/__init__.py" ] && [ -f "$VENV/.fork-vllm-stamp" ] ||
    die "the fork is not built ($TREE): run scripts/apply_and_build.sh first"

args=("$@")
case " $* " in
*" --quick "* | *" --report "*) ;;
*) args+=(--report bench/results/soak.md) ;; # relative: it runs from $ROOT
esac
# The hub is unreachable: the tiny models are written on the fly.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
cd "$ROOT"
exec "$PY" -m bench.soak "${args[@]}"
