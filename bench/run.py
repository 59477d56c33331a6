# SPDX-License-Identifier: Apache-2.0
"""Store-traffic benchmark: stock vLLM 0.29.0 against the fork (retention
interval None, 512, 0) on four model geometries and two workloads.

    python -m bench.run --stock-tree DIR [--fork-tree DIR] [--quick] [--repeats N]

Each repetition runs one driver process per tree, stock and fork, in
alternating order so both see the same machine load; store bytes and hits are
deterministic and taken once, the scheduler-hook cost is paired per
repetition. --quick runs the
headline (DeepSeek-V4-Flash, GSM8K-like) at full size and the rest scaled down,
once, checks the invariants and exits 1 on a violation. The full run also
writes bench/results/. Progress goes to stderr."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.geometries import BUILDERS
from bench.workloads import DESCRIPTIONS

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = [None, 512, 0]
# Issue 4's targets on the headline, as reductions vs stock.
HEADLINE = ("deepseek-v4-flash", "gsm8k")
REDUCTION_FLOOR = {512: 0.958, 0: 0.977}
MIN_SLACK = 1.01
COST_TARGET = 1.10


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def label(retention) -> str:
    return "stock" if retention == "stock" else f"fork {retention}"


def drive(tree: Path, runs: list[dict], quick: bool) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        config, out = Path(tmp, "config.json"), Path(tmp, "out.jsonl")
        config.write_text(json.dumps({"runs": runs, "quick": quick}))
        env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{ROOT}",
                   HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   VLLM_LOGGING_LEVEL="ERROR")  # fmt: skip
        subprocess.run(
            [sys.executable, "-m", "bench.driver", str(config), str(out)],
            env=env, cwd=ROOT, check=True,
        )  # fmt: skip
        results = [json.loads(line) for line in out.read_text().splitlines()]
    for r in results:
        if "vllm_file" in r and not Path(r["vllm_file"]).is_relative_to(tree):
            raise SystemExit(f"expected vLLM from {tree}, imported {r['vllm_file']}")
    return results


def plan(quick: bool, geometries: list[str]) -> list[tuple[str, str, bool]]:
    """(geometry, workload, scaled down) pairs."""
    return [
        (g, w, quick and (g, w) != HEADLINE)
        for g in geometries
        for w in ("gsm8k", "agentic")
    ]


def measure(args) -> dict:
    pairs = plan(args.quick, args.geometries)
    stock_runs, fork_runs = [], []
    for g, w, small in pairs:
        base = {"geometry": g, "workload": w, "small": small}
        stock_runs.append({**base, "retention": "stock", "stock": True})
        fork_runs += [{**base, "retention": r, "stock": False} for r in SETTINGS]
    results: dict[tuple, dict] = {}
    costs: dict[tuple, list[float]] = {}
    for rep in range(args.repeats):
        order = [(args.stock_tree, stock_runs), (args.fork_tree, fork_runs)]
        for tree, runs in order[:: 1 if rep % 2 == 0 else -1]:
            log(f"repetition {rep + 1}/{args.repeats}: {len(runs)} runs on {tree}")
            # Scaled-down runs go in a driver process of their own flag.
            for small in (False, True):
                batch = [r for r in runs if r["small"] == small]
                if not batch:
                    continue
                for r in drive(tree, batch, quick=small):
                    key = (r["geometry"], r["workload"], r["retention"])
                    if key in results and "error" not in r:
                        old = results[key]
                        assert (old["store_bytes"], old["replay_hits"]) == (
                            r["store_bytes"], r["replay_hits"],
                        ), f"non-deterministic result for {key}"  # fmt: skip
                    results.setdefault(key, r)
                    if "error" not in r:
                        costs.setdefault(key, []).append(r["hook_us_per_step"])
    return {"pairs": pairs, "results": results, "costs": costs}


def analyse(m: dict) -> tuple[list[dict], list[dict], list[str]]:
    """summary.json records, table rows, invariant violations."""
    records, rows, violations = [], [], []
    results, costs = m["results"], m["costs"]
    for g, w, small in m["pairs"]:
        stock = results[(g, w, "stock")]
        dense = results[(g, w, None)]
        for retention in ["stock", *SETTINGS]:
            r = results[(g, w, retention)]
            if "error" in r:
                rows.append({"geometry": g, "workload": w, "retention": retention,
                             "small": small, "error": r["error"]})  # fmt: skip
                violations.append(f"{g} {w} {label(retention)}: {r['error']}")
                continue
            ratios = [
                f / s for f, s in zip(costs[(g, w, retention)], costs[(g, w, "stock")])
            ]
            # Hits at retained boundaries: every replay, the shared-prefix probe,
            # and the 512-multiple probes where 512 checkpoints are retained.
            retained = [
                i for i, p in enumerate(r["probe_hits"])
                if p["kind"] == "junction" or retention in ("stock", None, 512)
            ]  # fmt: skip
            # Lost: below dense (a sparse setting can hit more than dense where
            # dense never stored a window the GPU cache served).
            lost = sum(a < b for a, b in zip(r["replay_hits"], dense["replay_hits"]))
            lost += sum(
                r["probe_hits"][i]["hit"] < dense["probe_hits"][i]["hit"]
                for i in retained
            )
            reduction = 1 - r["store_bytes"] / stock["store_bytes"]
            row = {
                "geometry": g, "workload": w, "retention": retention, "small": small,
                "store_bytes": r["store_bytes"], "stock_store_bytes": stock["store_bytes"],
                "min_store_bytes": r["min_store_bytes"],
                "store_all_bytes": r["store_all_bytes"],
                "reduction": reduction,
                "ratio_to_min": r["store_bytes"] / r["min_store_bytes"],
                "hit_tokens": r["hit_tokens"], "dense_hit_tokens": dense["hit_tokens"],
                "lost_hits": lost,
                "probe_hits": [p["hit"] for p in r["probe_hits"]],
                "sched_cost_ratio": statistics.median(ratios),
                "sched_cost_spread": [min(ratios), max(ratios)],
                "hook_us_per_step": statistics.median(costs[(g, w, retention)]),
                "steps": r["steps"], "num_requests": r["num_requests"],
                "alignment_tokens": r["alignment_tokens"], "groups": r["groups"],
                "source": r["geometry_source"], "notes": r["geometry_notes"],
            }  # fmt: skip
            rows.append(row)
            records.append({k: row[k] for k in (
                "geometry", "workload", "retention", "store_bytes",
                "stock_store_bytes", "min_store_bytes", "hit_tokens",
                "dense_hit_tokens", "sched_cost_ratio")})  # fmt: skip
            name = f"{g} {w}{' (scaled down)' if small else ''} {label(retention)}"
            if lost:
                violations.append(f"{name}: {lost} hits below dense")
            if retention in (512, 0) and row["ratio_to_min"] > MIN_SLACK:
                violations.append(
                    f"{name}: stores {row['ratio_to_min']:.3f}x the theoretical minimum"
                )
            if (g, w) == HEADLINE and retention in REDUCTION_FLOOR:
                if reduction < REDUCTION_FLOOR[retention]:
                    violations.append(
                        f"{name}: {100 * reduction:.1f}% fewer store bytes than stock, "
                        f"target {100 * REDUCTION_FLOOR[retention]:.1f}%"
                    )
    return records, rows, violations


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f}"


def table(rows: list[dict]) -> str:
    lines = [
        "| setting | store MiB | vs stock | min MiB | / min | store-all MiB | "
        "hit tokens (dense) | lost hits | sched cost vs stock (spread) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(
                f"| {label(r['retention'])} | rejected: {r['error']} |||||||| "
            )
            continue
        lines.append(
            f"| {label(r['retention'])} | {mib(r['store_bytes'])} | "
            f"{-100 * r['reduction']:+.1f}% | {mib(r['min_store_bytes'])} | "
            f"{r['ratio_to_min']:.3f} | {mib(r['store_all_bytes'])} | "
            f"{r['hit_tokens']:,} ({r['dense_hit_tokens']:,}) | {r['lost_hits']} | "
            f"{r['sched_cost_ratio']:.2f}x ({r['sched_cost_spread'][0]:.2f}-"
            f"{r['sched_cost_spread'][1]:.2f}) |"
        )
    return "\n".join(lines)


def write_results(out: Path, rows, records, violations, args, seconds) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(records, indent=1) + "\n")
    md = [
        "# Store-traffic benchmark",
        "",
        "Generated by `scripts/bench_store.sh` (`python -m bench.run`); do not edit.",
        f"Stock vLLM 0.29.0 (empty series) against the fork at retention "
        f"interval None (dense), 512 and 0; {args.repeats} repetitions, "
        f"{seconds:.0f} s on {os.cpu_count()} CPUs.",
        "",
        "Columns: *store* = offload store bytes in the first pass (stored chunks x "
        "the group's bytes per chunk); *vs stock* = change against stock; *min* = "
        "the theoretical minimum for the setting's retained boundaries (bench/"
        "driver.py `boundaries`); *store-all* = every complete prompt chunk of "
        "every group; *hit tokens* = external hit tokens when every request is "
        "replayed alone with an empty GPU prefix cache (dense in brackets); *lost "
        "hits* = replays and retained-boundary probes that hit less than dense; "
        "*sched cost* = time in the connector's scheduler hooks per step "
        "against stock, median over repetitions (min-max).",
        "",
        "Workloads:",
        *(f"- {d}" for d in DESCRIPTIONS.values()),
        "",
    ]
    by_pair: dict[tuple, list] = {}
    for r in rows:
        by_pair.setdefault((r["geometry"], r["workload"]), []).append(r)
    for (g, w), pair_rows in by_pair.items():
        ok = next((r for r in pair_rows if "error" not in r), None)
        md += [f"## {g} / {w}", ""]
        if ok:
            md += [f"Source: {ok['source']}. Alignment {ok['alignment_tokens']} tokens; "
                   f"{ok['num_requests']} requests.", "",
                   "KV groups: " + "; ".join(
                       f"{x['spec']} x{x['layers']} ({x['kind']}, {x['tokens_per_chunk']} "
                       f"tok/chunk, {x['bytes_per_chunk']:,} B/chunk)" for x in ok["groups"]),
                   ""]  # fmt: skip
            md += [f"Note: {n}" for n in ok["notes"]] + ([""] if ok["notes"] else [])
        md += [table(pair_rows), ""]
    md += ["## Invariant violations", ""]
    md += [f"- {v}" for v in violations] or ["none"]
    (out / "results.md").write_text("\n".join(md) + "\n")
    plot(out, rows)


def plot(out: Path, rows: list[dict]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed: no plots (scripts/requirements-build.txt)")
        return
    pairs = sorted({(r["geometry"], r["workload"]) for r in rows})
    names = [f"{g}\n{w}" for g, w in pairs]
    settings = ["stock", *SETTINGS]

    def value(g, w, s, key):
        r = next(
            r
            for r in rows
            if (r["geometry"], r["workload"], r["retention"]) == (g, w, s)
        )
        return r.get(key, 0) if "error" not in r else 0

    def bars(key, ylabel, fname, scale=1.0, log_scale=False):
        fig, ax = plt.subplots(figsize=(12, 4.5))
        width = 0.8 / len(settings)
        for i, s in enumerate(settings):
            ax.bar(
                [x + i * width for x in range(len(pairs))],
                [value(g, w, s, key) / scale for g, w in pairs],
                width,
                label=label(s),
            )
        if log_scale:
            ax.set_yscale("log")
        ax.set_xticks(
            [x + 0.4 - width / 2 for x in range(len(pairs))], names, fontsize=8
        )
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=100)
        plt.close(fig)

    bars("store_bytes", "offload store MiB (log)", "store_bytes.png", 2**20, True)
    bars("hit_tokens", "replay hit tokens", "hit_tokens.png")
    # Store bytes over the setting's theoretical minimum.
    fig, ax = plt.subplots(figsize=(12, 4.5))
    width = 0.8 / len(SETTINGS)
    for i, s in enumerate(SETTINGS):
        ax.bar(
            [x + i * width for x in range(len(pairs))],
            [value(g, w, s, "ratio_to_min") for g, w in pairs],
            width,
            label=label(s),
        )
    ax.axhline(
        MIN_SLACK, color="black", linewidth=0.8, linestyle="--", label="1% over min"
    )
    ax.set_yscale("log")
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(pairs))], names, fontsize=8)
    ax.set_ylabel("store bytes / theoretical minimum (log)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "bytes_vs_min.png", dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stock-tree", type=Path, required=True)
    parser.add_argument("--fork-tree", type=Path, default=ROOT / "upstream" / "vllm")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--geometries", nargs="+", default=list(BUILDERS))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    args.stock_tree, args.fork_tree = (
        args.stock_tree.resolve(),
        args.fork_tree.resolve(),
    )
    args.repeats = args.repeats or (1 if args.quick else 3)
    t0 = time.time()
    records, rows, violations = analyse(measure(args))
    seconds = time.time() - t0
    for (g, w), pair in sorted(
        {(r["geometry"], r["workload"]): 0 for r in rows}.items()
    ):
        print(
            f"\n{g} / {w}\n"
            + table([r for r in rows if (r["geometry"], r["workload"]) == (g, w)])
        )
    if not args.quick:
        write_results(args.out, rows, records, violations, args, seconds)
        log(f"wrote {args.out}")
    log(f"{seconds:.0f} s")
    if violations:
        print("\nINVARIANT VIOLATIONS:\n" + "\n".join(f"  {v}" for v in violations))
        sys.exit(1)
    print("\nall invariants hold")


if __name__ == "__main__":
    main()
