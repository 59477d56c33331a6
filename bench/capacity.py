# SPDX-License-Identifier: Apache-2.0
"""Offload capacity: hit tokens vs the CPU offload budget, vLLM's own CPU
offloading manager (LRU and ARC) for stock 0.29.0 and the fork at retention
None / 512 / 0, per geometry and workload. Sparse stores are worth the RAM and
transfer they save; this measures how much budget each setting needs.

    python -m bench.capacity --stock-tree DIR --fork-tree DIR [--quick]
        [--out bench/results] [--points N]

Each setting runs the same GPU prefix-cache retention on both sides (stock's
connector ignores the interval, its GPU cache does not). Phase 1 runs the
unlimited recorder per setting (reference hits, footprint in CPU blocks);
phase 2 sweeps a log-spaced budget grid common to the pair, from well below
the smallest footprint to above the largest, plus the fixed budget and an
unlimited one, then bisects the 90% budget (bench/capacity_driver.py has the
hit measure). Stock and fork run in concurrent driver processes, one per
tree. Full mode: every pair at retention 0 (about 15 min on 2 cores; the
headline at None / 512 / 0: --geometries deepseek-v4-flash --workloads
gsm8k --retentions None 512 0). --quick: the headline pair only, scaled down,
all three retentions (the CI invariants); writes under --out only when given.
Exits 1 on a violated invariant."""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.run import PIN_VERSION, base_version

ROOT = Path(__file__).resolve().parents[1]
RETENTIONS = [None, 512, 0]
POLICIES = ["lru", "arc"]
HEADLINE = ("deepseek-v4-flash", "gsm8k")
GEOMETRIES = ["deepseek-v4-flash", "gpt-oss-20b", "gemma-3-12b", "granite-4.0-h-1b"]
WORKLOADS = ["gsm8k", "agentic"]
# The fixed budget: a tenth of what stock's dense stores of the workload
# occupy, i.e. a host tier sized for a tenth of the traffic it sees.
FIXED_SHARE = 0.1
# A hit drop between neighbouring budgets above this share of the unlimited
# hits is reported as non-monotone (LRU/ARC are not stack algorithms).
MONOTONE_SLACK = 0.1
SPEC_KEYS = ("geometry", "workload", "small", "stock", "retention", "gpu_retention",
             "block_bytes")  # fmt: skip


def log(msg: str) -> None:
    print(f"[capacity {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def retention(text: str):
    return None if text == "None" else int(text)


def label(stock: bool, retention) -> str:
    return f"{'stock' if stock else 'fork'} {retention}"


def drive_both(jobs: dict[Path, list[dict]]) -> list[dict]:
    """One ``bench.capacity_driver`` process per tree, all at once."""
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for i, (tree, runs) in enumerate(jobs.items()):
            config, out = Path(tmp, f"{i}.json"), Path(tmp, f"{i}.jsonl")
            config.write_text(json.dumps({"runs": runs}))
            # A fixed hash seed: the connector iterates sets of block-hash
            # keys, so eviction order (and hits under eviction) would follow
            # the per-process str/bytes hash randomisation.
            env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{ROOT}",
                       HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                       VLLM_LOGGING_LEVEL="ERROR", PYTHONHASHSEED="0")  # fmt: skip
            cmd = [sys.executable, "-m", "bench.capacity_driver", config, out]
            procs.append((tree, out, subprocess.Popen(cmd, env=env, cwd=ROOT)))
        results = []
        for tree, out, proc in procs:
            if proc.wait():
                raise SystemExit(f"capacity driver on {tree} exited {proc.returncode}")
            for line in out.read_text().splitlines():
                r = json.loads(line)
                if not Path(r["vllm_file"]).is_relative_to(tree):
                    raise SystemExit(f"expected vLLM from {tree}, got {r['vllm_file']}")
                results.append(r)
    return results


def settings(g: str, w: str, small: bool, retentions=RETENTIONS) -> list[dict]:
    return [
        {
            "geometry": g,
            "workload": w,
            "small": small,
            "stock": stock,
            "retention": r,
            "gpu_retention": r,
        }  # fmt: skip
        for stock in (True, False)
        for r in retentions
    ]


def grid(footprints: list[int], points: int) -> list[int]:
    """Log-spaced CPU block counts from an eighth of the smallest footprint to
    1.5x the largest."""
    lo, hi = max(1, min(footprints) // 8), max(2, math.ceil(max(footprints) * 1.5))
    step = (hi / lo) ** (1 / max(points - 1, 1))
    return sorted({round(lo * step**i) for i in range(points)})


def measure(args) -> dict:
    pairs = [
        (g, w, args.quick) for g in args.geometries for w in args.workloads
        if not args.quick or (g, w) == HEADLINE
    ]  # fmt: skip
    specs = [s for p in pairs for s in settings(*p, args.retentions)]
    key = lambda r: (r["geometry"], r["workload"], r["stock"], r["retention"])  # noqa: E731
    tree = lambda s: args.stock_tree if s["stock"] else args.fork_tree  # noqa: E731

    def split(runs):
        return {
            t: [r for r in runs if tree(r) == t]
            for t in (args.stock_tree, args.fork_tree)
        }

    t0 = time.time()
    log(f"phase 1: {len(specs)} recorder runs")
    recorded = {
        key(r): r for r in drive_both(split([{**s, "mode": "recorder"} for s in specs]))
    }
    sweeps, fixed = [], {}
    for g, w, _ in pairs:
        mine = [
            recorded[key(s)] for s in specs if s["geometry"] == g and s["workload"] == w
        ]
        footprints = [r["footprint_blocks"] for r in mine]
        stock_max = max(r["footprint_blocks"] for r in mine if r["stock"])
        fixed[(g, w)] = max(1, round(FIXED_SHARE * stock_max))
        budgets = sorted({*grid(footprints, args.points), fixed[(g, w)]})
        for r in mine:
            sweeps.append({**{k: r[k] for k in SPEC_KEYS}, "mode": "sweep",
                           "budgets": budgets, "policies": args.policies})  # fmt: skip
    log(f"phase 2: {len(sweeps)} sweeps ({time.time() - t0:.0f} s so far)")
    swept = {key(r): r for r in drive_both(split(sweeps))}
    return {"pairs": pairs, "retentions": args.retentions, "specs": specs, "recorded": recorded, "swept": swept,
            "fixed": fixed, "seconds": round(time.time() - t0, 1),
            "stock_version": base_version(args.stock_tree),
            "stock_patches": tree_patches(args.stock_tree)}  # fmt: skip


def tree_patches(tree: Path) -> list[str]:
    """Subjects of the commits above the release sdist in a tree: a stock
    tree may carry a fix under comparison (e.g. upstream's ARC fix)."""
    if not (tree / ".git").exists():  # not the enclosing repository's log
        return []
    log = subprocess.run(["git", "-C", tree, "log", "--reverse", "--format=%s"],
                         capture_output=True, text=True)  # fmt: skip
    return log.stdout.splitlines()[1:] if log.returncode == 0 else []


def hits_at(points: list[dict], blocks) -> int:
    return next(p["hits"] for p in points if p["budget_blocks"] == blocks)


def analyse(m: dict) -> tuple[list[dict], list[str]]:
    """capacity.json records, invariant violations."""
    records, violations = [], []
    for g, w, small in m["pairs"]:
        keep = {}
        for s in settings(g, w, small, m["retentions"]):
            k = (g, w, s["stock"], s["retention"])
            rec, sw = m["recorded"][k], m["swept"][k]
            name = f"{g} {w} {label(s['stock'], s['retention'])}"
            for policy in sw["policies"]:
                points = sw["points"][policy]
                full = points[-1]
                k90 = sw["keep90"][policy]
                keep[(s["stock"], s["retention"], policy)] = k90 and k90["blocks"]
                if full["hits"] != rec["hits"]:
                    violations.append(f"{name} {policy}: unlimited hits {full['hits']} "
                                      f"!= recorder {rec['hits']}")  # fmt: skip
                finite = [p for p in points if p["budget_blocks"] is not None]
                for a, b in zip(finite, finite[1:]):
                    if b["hits"] < a["hits"] - MONOTONE_SLACK * full["hits"]:
                        violations.append(
                            f"{name} {policy}: hits fall {a['hits']} -> {b['hits']} "
                            f"from {a['budget_blocks']} to {b['budget_blocks']} blocks"
                        )
                records.append({
                    "geometry": g, "workload": w, "small": small,
                    "setting": "stock" if s["stock"] else "fork",
                    "retention": s["retention"], "policy": policy,
                    "block_bytes": sw["block_bytes"],
                    "footprint_blocks": rec["footprint_blocks"],
                    "recorder_hits": rec["hits"], "unlimited_hits": full["hits"],
                    "keep90": k90,
                    "fixed_budget_blocks": m["fixed"][(g, w)],
                    "fixed_budget": next(p for p in points
                                         if p["budget_blocks"] == m["fixed"][(g, w)]),
                    "unlimited": full, "points": points,
                    "vllm_file": sw["vllm_file"],
                })  # fmt: skip
        for r in m["retentions"]:
            for policy in POLICIES:
                fork, stock = keep.get((False, r, policy)), keep.get((True, r, policy))
                # Only dense stock (the pin) must need more budget: newer
                # releases store sparsely at interval 0 themselves.
                if (
                    (g, w) == HEADLINE and r == 0 and fork and stock
                    and fork >= stock and m.get("stock_version") == PIN_VERSION
                ):  # fmt: skip
                    violations.append(f"{g} {w} {policy}: fork 0 needs {fork} blocks "
                                      f"for 90%, stock {stock}")  # fmt: skip
    return records, violations


# --- Report --------------------------------------------------------------------


def gib(n: float | None) -> str:
    return "–" if n is None else f"{n / 2**30:,.3f}"


def table(records: list[dict], fixed_note: str) -> str:
    lines = [
        "| geometry | workload | setting | policy | footprint GiB | 90% budget GiB "
        "| vs stock | hits @ fixed | / unlimited | vs stock @ fixed "
        "| transfer GiB @ fixed | transfer GiB unlimited |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    stock90 = {
        (r["geometry"], r["workload"], r["retention"], r["policy"]):
        r["keep90"] and r["keep90"]["bytes"]
        for r in records if r["setting"] == "stock"
    }  # fmt: skip
    stock_fixed = {
        (r["geometry"], r["workload"], r["retention"], r["policy"]):
        r["fixed_budget"]["hits"]
        for r in records if r["setting"] == "stock"
    }  # fmt: skip
    for r in records:
        key = (r["geometry"], r["workload"], r["retention"], r["policy"])
        k90 = r["keep90"] and r["keep90"]["bytes"]
        base = stock90[key]
        ratio = f"{k90 / base:.3f}x" if k90 and base else "–"
        fx, full = r["fixed_budget"], r["unlimited"]["hits"]
        share = f"{fx['hits'] / full:.0%}" if full else "–"
        # Hits at the fixed budget against stock's: below 1.000x the fork
        # hits less than stock with the same host memory.
        fixed_ratio = (
            f"{fx['hits'] / stock_fixed[key]:.3f}x" if stock_fixed[key] else "–"
        )
        lines.append(
            f"| {r['geometry']} | {r['workload']} | {r['setting']} {r['retention']} "
            f"| {r['policy']} | {gib(r['footprint_blocks'] * r['block_bytes'])} "
            f"| {gib(k90)} | {ratio} | {fx['hits']:,} | {share} | {fixed_ratio} "
            f"| {gib(fx['stored_bytes'])} | {gib(r['unlimited']['stored_bytes'])} |"
        )
    return "\n".join(lines) + "\n\n" + fixed_note


def below_stock(records: list[dict]) -> str:
    """Every budget both sides ran (the grid and the fixed budget; bisection
    points differ) where the fork hits less than stock, not only the fixed
    budget: LRU and ARC are not stack algorithms, so one point can mislead."""
    stock = {
        (r["geometry"], r["workload"], r["retention"], r["policy"]): {
            p["budget_blocks"]: p["hits"] for p in r["points"]
        }
        for r in records if r["setting"] == "stock"
    }  # fmt: skip
    rows, compared = [], 0
    for r in (r for r in records if r["setting"] == "fork"):
        base = stock[(r["geometry"], r["workload"], r["retention"], r["policy"])]
        for p in r["points"]:
            if p["budget_blocks"] is None or p["budget_blocks"] not in base:
                continue
            compared += 1
            if p["hits"] < base[p["budget_blocks"]]:
                rows.append(
                    f"| {r['geometry']} | {r['workload']} | {r['retention']} "
                    f"| {r['policy']} | {gib(p['budget_bytes'])} "
                    f"| {base[p['budget_blocks']]:,} | {p['hits']:,} "
                    f"| {p['hits'] / base[p['budget_blocks']]:.3f}x |"
                )
    head = [
        f"The fork hits less than stock at {len(rows)} of {compared} budgets both "
        "ran (unlimited excluded).\n",
    ]
    if rows:
        head += [
            "| geometry | workload | retention | policy | budget GiB | stock hits "
            "| fork hits | fork vs stock |",
            "|---|---|---|---|---:|---:|---:|---:|",
            *rows,
        ]
    return "\n".join(head) + "\n"


def plot(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = list(dict.fromkeys((r["geometry"], r["workload"]) for r in records))
    cols = min(2, len(pairs))
    rows = math.ceil(len(pairs) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, 4 * rows), squeeze=False)
    colors = {("stock", r): c for r, c in zip(RETENTIONS, ("k", "0.4", "0.7"))}
    colors |= {("fork", r): c for r, c in zip(RETENTIONS, ("C0", "C1", "C2"))}
    for ax, (g, w) in zip(axes.flat, pairs):
        for r in (r for r in records if (r["geometry"], r["workload"]) == (g, w)):
            pts = [p for p in r["points"] if p["budget_blocks"] is not None]
            ax.plot([p["budget_bytes"] / 2**30 for p in pts], [p["hits"] for p in pts],
                    color=colors[(r["setting"], r["retention"])], marker=".",
                    linestyle="-" if r["policy"] == "lru" else "--",
                    label=f"{r['setting']} {r['retention']} {r['policy']}")  # fmt: skip
        fixed = next(r for r in records if (r["geometry"], r["workload"]) == (g, w))
        ax.axvline(fixed["fixed_budget"]["budget_bytes"] / 2**30, color="r", lw=0.5)
        ax.set_xscale("log")
        ax.set_title(f"{g}, {w}", fontsize=10)
        ax.set_xlabel("CPU offload budget (GiB, cpu_bytes_to_use)")
        ax.set_ylabel("replay hit tokens")
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(pairs) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(records: list[dict], m: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    note = (
        f"Fixed budget: {FIXED_SHARE:.0%} of stock's unlimited footprint for the pair "
        "(the red line in the plots), a host tier sized for a tenth of what dense "
        "stores of the traffic take. 90% budget: the smallest `cpu_bytes_to_use` "
        "keeping 90% of the unlimited-budget replay hits (bisected to 20%); "
        "footprint: the CPU blocks the unlimited recorder holds. Transfer: bytes "
        "written to the tier in pass 1. One CPU block per offload key, sized as "
        "`CPUOffloadingSpec` does."
    )
    headline = [r for r in records if (r["geometry"], r["workload"]) == HEADLINE]
    text = [
        "# Offload capacity: replay hit tokens vs CPU offload budget\n",
        "vLLM's own `CPUOffloadingSpec` / `CPUOffloadingManager` (LRU and ARC) "
        "with a `cpu_bytes_to_use` budget under the real scheduler and "
        "OffloadingConnector; hits = cold-GPU replay of every prompt against the "
        "tier the workload left (see `bench/capacity_driver.py`). Stock is vLLM "
        f"{m.get('stock_version', PIN_VERSION)} "
        + (
            "plus " + "; ".join(f"`{s}`" for s in m["stock_patches"]) + "."
            if m.get("stock_patches")
            else "with an empty series."
        )
        + " Stock and fork "
        "run each setting with the same GPU prefix-cache retention. Generated by "
        f"`python -m bench.capacity` in {m['seconds']} s.\n",
        "## Headline: DeepSeek-V4-Flash, GSM8K-like\n",
        table(headline, note) if headline else "(not run)",
        "\n## Every geometry and workload\n",
        table(records, note),
        "\n## Every budget where the fork hits less than stock\n",
        below_stock(records),
        "\n![hit tokens vs budget](capacity.png)\n",
    ]
    (out / "capacity.md").write_text("\n".join(text))
    (out / "capacity.json").write_text(json.dumps(records, indent=1) + "\n")
    plot(records, out / "capacity.png")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stock-tree", type=Path, required=True)
    p.add_argument("--fork-tree", type=Path, default=ROOT / "upstream" / "vllm")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--points", type=int, default=6, help="log-spaced sweep points")
    p.add_argument("--policies", nargs="+", default=POLICIES, choices=POLICIES)
    p.add_argument("--retentions", nargs="+", type=retention, default=None,
                   help="None 512 0 (--quick); 0 in full mode, to stay < 20 min")  # fmt: skip
    p.add_argument("--geometries", nargs="+", default=GEOMETRIES, choices=GEOMETRIES)
    p.add_argument("--workloads", nargs="+", default=WORKLOADS, choices=WORKLOADS)
    args = p.parse_args(argv)
    args.retentions = args.retentions or (RETENTIONS if args.quick else [0])
    args.stock_tree, args.fork_tree = (
        args.stock_tree.resolve(),
        args.fork_tree.resolve(),
    )
    m = measure(args)
    records, violations = analyse(m)
    out = args.out or (None if args.quick else ROOT / "bench" / "results")
    if out:
        write(records, m, out)
        log(f"wrote {out}/capacity.md, capacity.json, capacity.png")
    for r in records:
        k90 = r["keep90"]
        log(f"{r['geometry']} {r['workload']} {r['setting']} {r['retention']} "
            f"{r['policy']}: 90% at {gib(k90 and k90['bytes'])} GiB, fixed "
            f"{r['fixed_budget']['hits']:,}/{r['unlimited']['hits']:,} hits")  # fmt: skip
    for v in violations:
        log(f"VIOLATION: {v}")
    log(f"done in {m['seconds']} s, {len(violations)} violations")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
