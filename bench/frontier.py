# SPDX-License-Identifier: Apache-2.0
"""The measured frontier: the GPU prefix cache's retention interval against
the OffloadingConnector's own (``retention_interval`` in its extra config),
{None, 512, 0} x {None, 512, 0}, on the store benchmark's cells.

    python -m bench.frontier [--quick] [--out DIR] [--stock-tree DIR]
        [--fork-tree DIR] [--scaled-down] [--geometries ...]
        [--capacity-geometries ...] [--capacity-from FRONTIER_JSON]

Cells: every geometry x {gsm8k, agentic} at the default variant, and the
decode-offloading cells of bench/run.py EXTRA_CELLS. One repetition, no cost
timing. Per (GPU g, offload o) pair, the fork's driver run (bench/driver.py,
the spec's "offload_retention" = o) gives store bytes, the theoretical
minimum at o (prompt + output with decode offloading), replay and probe
hits; lost hits are counted against the every-chunk reference at GPU g (the
fork with its masks off) at the OFFLOAD interval (bench/run.py ``lost``):
the offload tier at o must serve at least what the GPU prefix cache at o
serves. Stock 0.29.0 (GPU at g; it stores every chunk whatever the
interval) is the reference point. The diagonal g == o is upstream 0.33.0's
pairing: one interval for both tiers.

Capacity (default cells): replay hit tokens under vLLM's CPU offloading
manager, LRU and ARC (bench/capacity_driver.py ``budget_run``), at fixed
budgets of SHARES of stock's dense footprint for the geometry and workload
(the most CPU blocks stock's stores take over its three GPU intervals); no
sweep, no bisection. A budget that holds every block a setting stores
never evicts: its hits are the unlimited ones, the replay hits of the
setting's driver run (copied, as capacity_driver.point does).

Full mode: stock bytes, then fork bytes (one process at a time), then the
capacity runs (two at a time), writes frontier.md, frontier.json and
frontier_<geometry>.png under --out (bench/results). --quick: a few
scaled-down cells on the fork only (no stock, no capacity), for CI; writes
under --out only when given. --scaled-down: every cell scaled down, the
whole pipeline (a smoke test). --capacity-from: the capacity of
--capacity-geometries added to a finished run's frontier.json (bytes and
hits not rerun), rendered under --out (default: beside it). Exits 1 on a
violated invariant. Progress goes to stderr."""

import argparse
import json
import math
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.geometries import BUILDERS
from bench.run import EXTRA_CELLS, MIN_SLACK, base_version, drive, label, lost

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
SETTINGS = [None, 512, 0]
PAIRS = [(g, o) for g in SETTINGS for o in SETTINGS]
WORKLOADS = ["gsm8k", "agentic"]
# Fixed CPU budgets, as shares of stock's dense footprint.
SHARES = (0.1, 0.5)
POLICIES = ("lru", "arc")
# --quick: scaled down. Sliding-window stores (DeepSeek-V4), decode
# offloading (gpt-oss-20b), Mamba (Granite-4.0-H).
QUICK_CELLS = [
    ("deepseek-v4-flash", "gsm8k", "default"),
    ("gpt-oss-20b", "agentic", "decode"),
    ("granite-4.0-h-1b", "agentic", "default"),
]
# Stock 0.33.0 on the same cells, from the last bench.run of that release.
STOCK_033 = RESULTS / "0.33.0" / "summary.json"
MIB = 2**20


def log(msg: str) -> None:
    print(f"[frontier {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pair_name(g, o) -> str:
    return f"{label(g)} / {label(o)}"


def cell_name(g: str, w: str, v: str) -> str:
    return f"{w}" + ("" if v == "default" else f" ({v})")


def plan(args) -> list[tuple[str, str, str, bool]]:
    """(geometry, workload, variant, scaled down) cells."""
    if args.quick:
        return [(*c, True) for c in QUICK_CELLS if c[0] in args.geometries]
    cells = [(g, w, "default") for g in args.geometries for w in WORKLOADS]
    cells += [c for c in EXTRA_CELLS if c[2] == "decode" and c[0] in args.geometries]
    return [(*c, args.scaled_down) for c in cells]


def byte_runs(cells, tree: str) -> list[dict]:
    """Driver specs: stock at each GPU interval; the fork's every-chunk
    reference at each GPU interval and every (GPU, offload) pair."""
    runs = []
    for g, w, v, small in cells:
        base = {"geometry": g, "workload": w, "variant": v, "small": small}
        if tree == "stock":
            runs += [{**base, "retention": r, "tree": "stock"} for r in SETTINGS]
            continue
        runs += [{**base, "retention": r, "tree": "every"} for r in SETTINGS]
        runs += [
            {**base, "retention": gpu, "offload_retention": off, "tree": "fork"}
            for gpu, off in PAIRS
        ]
    return runs


def key(r: dict) -> tuple:
    """A run's identity: cell, tree, GPU interval, offload interval (the
    GPU's where the run named none)."""
    off = r.get("offload_retention", r["retention"])
    return (r["geometry"], r["workload"], r["variant"], r["tree"], r["retention"], off)


def record_key(rec: dict) -> tuple:
    """A frontier.json record's run key (stock: offload = GPU interval)."""
    off = rec["offload"] if rec["setting"] == "fork" else rec["gpu"]
    return (rec["geometry"], rec["workload"], rec["variant"], rec["setting"],
            rec["gpu"], off)  # fmt: skip


def footprint(run: dict) -> int:
    """CPU blocks a setting's stores take: one per offload key."""
    return sum(run["stored_chunks"].values())


def finer(run: dict) -> bool:
    """Sliding-window chunks finer than the hit alignment (DeepSeek-V4): a
    chunk outside every window before an aligned hit serves no hit, so
    offload None stores the dense minimum (those windows, and the tails a
    GPU hit is served from), not every chunk the every-chunk reference
    stores."""
    align = run["alignment_tokens"]
    return any(
        x["kind"] == "swa" and x["tokens_per_chunk"] < align for x in run["groups"]
    )


def unlimited(results: dict) -> dict[tuple, dict]:
    """Per run key, the footprint and replay hits of its driver run."""
    return {
        k: {"blocks": footprint(r), "hits": r["hit_tokens"]}
        for k, r in results.items()
        if "error" not in r
    }


def fixed_budgets(cells, full: dict, geometries) -> dict:
    """{(geometry, workload): budgets in CPU blocks}: SHARES of stock's dense
    footprint (its most blocks over the GPU intervals), default cells."""
    budgets = {}
    for g, w, v, _ in cells:
        if v != "default" or g not in geometries:
            continue
        dense = max(full[(g, w, v, "stock", r, r)]["blocks"] for r in SETTINGS)
        budgets[(g, w)] = [max(1, round(s * dense)) for s in SHARES]
    return budgets


def capacity_jobs(cells, full: dict, budgets: dict, tree: str) -> list[dict]:
    """Fixed-budget jobs of the default cells for one tree: stock at each
    GPU interval, the fork at each pair. ``unlimited``: the setting's
    footprint and replay hits (``full``, from its driver run)."""
    settings = (
        [(r, r, "stock") for r in SETTINGS]
        if tree == "stock"
        else [(g, o, "fork") for g, o in PAIRS]
    )
    jobs = []
    for g, w, v, small in cells:
        if (g, w) not in budgets or v != "default":
            continue
        for gpu, off, t in settings:
            job = {"geometry": g, "workload": w, "variant": v, "small": small,
                   "tree": t, "stock": t == "stock", "retention": gpu,
                   "gpu_retention": gpu, "budgets": budgets[(g, w)],
                   "policies": list(POLICIES),
                   "unlimited": full[(g, w, v, t, gpu, off)]}  # fmt: skip
            if t == "fork":
                job["offload_retention"] = off
            jobs.append(job)
    return jobs


# --- Worker (one process per tree) ---------------------------------------------


def capacity_run(job: dict, block_bytes: dict) -> dict:
    """Hits at each fixed budget, per policy (capacity_driver.budget_run);
    a budget holding the whole footprint copies the unlimited hits."""
    from bench.capacity_driver import budget_run, cpu_block_bytes
    from bench.driver import Sim, workload

    g = job["geometry"]
    if g not in block_bytes:
        block_bytes[g] = cpu_block_bytes(Sim(g, job["gpu_retention"]))
    spec = {**job, "block_bytes": block_bytes[g]}
    rounds = workload(job["workload"], job["small"])
    full = job["unlimited"]
    points = {}
    for policy in job["policies"]:
        points[policy] = [
            {"policy": policy, "budget_blocks": b, "hits": full["hits"], "copied": True}
            if b >= full["blocks"]
            else budget_run(spec, rounds, b, policy)
            for b in job["budgets"]
        ]
        for p in points[policy]:
            p["budget_bytes"] = p["budget_blocks"] * block_bytes[g]
    import vllm

    return {**job, "block_bytes": block_bytes[g], "points": points,
            "vllm_file": vllm.__file__}  # fmt: skip


def worker(config: Path, out: Path) -> None:
    from bench import driver

    runs = json.loads(config.read_text())["runs"]
    block_bytes: dict = {}
    with open(out, "a") as f:
        for job in runs:
            t0 = time.time()
            if "budgets" in job:
                result = capacity_run(job, block_bytes)
                log(f"capacity {' '.join(map(str, key(job)))}: "
                    f"{time.time() - t0:.1f} s")  # fmt: skip
            else:
                result = driver.run(job, job["small"])
            f.write(json.dumps(result) + "\n")
            f.flush()


# --- Measure --------------------------------------------------------------------


def run_trees(tree: Path, jobs: list[dict], what: str) -> list[dict]:
    if not jobs:
        return []
    t0 = time.time()
    log(f"{what}: {len(jobs)} runs on {tree}")
    results = drive(tree, jobs, False, command=("bench.frontier", "--worker"))
    log(f"{what}: {time.time() - t0:.0f} s")
    return results


def measure(args) -> dict:
    cells = plan(args)
    t0 = time.time()
    results: dict[tuple, dict] = {}
    timings = {}
    phases = [(args.fork_tree, "fork", "fork bytes and hits")]
    if not args.quick:
        phases.insert(0, (args.stock_tree, "stock", "stock bytes and hits"))
    for tree, kind, what in phases:
        t = time.time()
        for r in run_trees(tree, byte_runs(cells, kind), what):
            results[key(r)] = r
        timings[what] = round(time.time() - t)
    budgets, capacity = {}, {}
    if not args.quick:
        full = unlimited(results)
        budgets = fixed_budgets(cells, full, args.capacity_geometries)
        capacity = measure_capacity(args, cells, full, budgets, timings)
    return {"cells": cells, "results": results, "budgets": budgets,
            "capacity": capacity, "seconds": round(time.time() - t0),
            "timings": timings}  # fmt: skip


def run_two_at_a_time(parts: list[tuple[Path, list[dict]]], what: str) -> list[dict]:
    """(tree, jobs) parts, two driver processes at a time: their results are
    deterministic, only the wall time is shared."""
    with ThreadPoolExecutor(2) as pool:
        done = pool.map(lambda part: run_trees(part[0], part[1], what), parts)
        return [r for results in done for r in results]


def tree_parts(args, jobs: list[dict]) -> list[tuple[Path, list[dict]]]:
    """Stock's jobs in one process, the fork's in one per GPU interval."""
    parts = [(args.stock_tree, [j for j in jobs if j["tree"] == "stock"])]
    return parts + [
        (
            args.fork_tree,
            [j for j in jobs if j["tree"] == "fork" and j["retention"] == g],
        )
        for g in SETTINGS
    ]


def measure_capacity(args, cells, full: dict, budgets: dict, timings: dict) -> dict:
    """The fixed-budget runs of both trees, two processes at a time (hit
    counts are deterministic); their wall time into ``timings``."""
    t = time.time()
    jobs = capacity_jobs(cells, full, budgets, "stock")
    jobs += capacity_jobs(cells, full, budgets, "fork")
    capacity = {
        key(r): r for r in run_two_at_a_time(tree_parts(args, jobs), "capacity")
    }
    timings["capacity, 2 processes at a time"] = round(time.time() - t)
    return capacity


def add_capacity(args) -> dict:
    """--capacity-from: the fixed-budget runs of --capacity-geometries added
    to a finished run's frontier.json; replay hits are that run's records.
    Footprints are measured again (probe-free driver runs): runs made before
    bench.driver took ``stored_chunks`` after pass 1 counted the keys their
    replays and probes stored too."""
    doc = json.loads(args.capacity_from.read_text())
    mine = [
        tuple(c)
        for c in doc["cells"]
        if c[2] == "default" and c[0] in args.capacity_geometries
    ]
    t0 = time.time()
    runs = [{**r, "probe": False} for r in byte_runs(mine, "stock")]
    runs += [
        {**r, "probe": False} for r in byte_runs(mine, "fork") if r["tree"] == "fork"
    ]
    blocks = {}
    for r in run_two_at_a_time(tree_parts(args, runs), "footprints"):
        if "error" in r:
            raise SystemExit(f"footprint run {key(r)}: {r['error']}")
        blocks[key(r)] = footprint(r)
    doc["timings"]["footprints, 2 processes at a time"] = round(time.time() - t0)
    hits = {record_key(r): r["hit_tokens"] for r in doc["records"]}
    full = {k: {"blocks": b, "hits": hits[k]} for k, b in blocks.items()}
    budgets = fixed_budgets(mine, full, args.capacity_geometries)
    capacity = measure_capacity(args, mine, full, budgets, doc["timings"])
    for r in doc["records"]:
        k = record_key(r)
        r["footprint_blocks"] = blocks.get(k, r["footprint_blocks"])
        r["capacity"] = hits_at(capacity, k) or r.get("capacity")
    doc["budgets"].update({f"{g} {w}": b for (g, w), b in budgets.items()})
    doc["block_bytes"].update({k[0]: x["block_bytes"] for k, x in capacity.items()})
    doc["seconds"] += round(time.time() - t0)
    doc["command"] += f"; then {args.command}"
    return doc


# --- Analyse --------------------------------------------------------------------


def stock_033() -> dict:
    """Stock 0.33.0's records per (geometry, workload, variant, interval)."""
    if not STOCK_033.exists():
        return {}
    return {
        (r["geometry"], r["workload"], r["variant"], r["retention"]): r
        for r in json.loads(STOCK_033.read_text())
    }


def hits_at(capacity: dict, k: tuple) -> dict | None:
    """{policy: [hits at each budget]} of a setting, None without capacity."""
    run = capacity.get(k)
    if run is None:
        return None
    return {p: [x["hits"] for x in pts] for p, pts in run["points"].items()}


def analyse(m: dict) -> tuple[list[dict], list[str]]:
    """One record per (cell, setting); the runs that failed."""
    results, capacity = m["results"], m["capacity"]
    old = stock_033()
    records, errors = [], []
    for g, w, v, small in m["cells"]:
        cell = {"geometry": g, "workload": w, "variant": v, "small": small}
        name = f"{g} {w} {v}{' (scaled down)' if small else ''}"
        every = {r: results[(g, w, v, "every", r, r)] for r in SETTINGS}
        failed = [x["error"] for x in every.values() if "error" in x]
        for gpu, off in PAIRS:
            fork = results[(g, w, v, "fork", gpu, off)]
            if "error" in fork or "error" in every[gpu]:
                failed.append(fork.get("error") or every[gpu]["error"])
                continue
            ref = every[gpu]
            records.append({
                **cell, "setting": "fork", "gpu": gpu, "offload": off,
                "diagonal": gpu == off,
                "offload_effective": fork["offload_retention_effective"],
                "finer_windows": finer(fork),
                "store_bytes": fork["store_bytes"],
                "min_store_bytes": fork["min_store_bytes"],
                "ratio_to_min": fork["store_bytes"] / fork["min_store_bytes"],
                "hit_tokens": fork["hit_tokens"],
                "probes": len(fork["probe_hits"]),
                "probe_hit_tokens": sum(p["hit"] for p in fork["probe_hits"]),
                "lost_hits": lost(fork, ref, off),
                "every_store_bytes": ref["store_bytes"],
                "every_hit_tokens": ref["hit_tokens"],
                "every_probe_hit_tokens": sum(p["hit"] for p in ref["probe_hits"]),
                "footprint_blocks": footprint(fork),
                "capacity": hits_at(capacity, (g, w, v, "fork", gpu, off)),
            })  # fmt: skip
        for gpu in SETTINGS:
            stock = results.get((g, w, v, "stock", gpu, gpu))
            if stock is None:
                continue
            if "error" in stock:
                failed.append(stock["error"])
                continue
            o33 = old.get((g, w, v, gpu)) if not small else None
            records.append({
                **cell, "setting": "stock", "gpu": gpu, "offload": None,
                "diagonal": False, "store_bytes": stock["store_bytes"],
                "hit_tokens": stock["hit_tokens"],
                "probes": len(stock["probe_hits"]),
                "probe_hit_tokens": sum(p["hit"] for p in stock["probe_hits"]),
                "lost_hits": lost(stock, every[gpu], gpu),
                "footprint_blocks": footprint(stock),
                "capacity": hits_at(capacity, (g, w, v, "stock", gpu, gpu)),
                "stock_033": o33 and {
                    "store_bytes": o33["stock_store_bytes"],
                    "probe_hit_tokens": o33["stock_probe_hit_tokens"],
                    "hit_tokens": o33["stock_hit_tokens"],
                    "lost_hits": o33["stock_lost_hits"],
                },
            })  # fmt: skip
        errors += [f"{name}: {e}" for e in failed]
    return records, errors


def check(records: list[dict]) -> list[str]:
    """The frontier's invariants, per fork pair: no hit lost at the offload
    interval; no more than every chunk; offload None stores every chunk a
    hit can use (the every-chunk reference's bytes; where sliding-window
    chunks are finer than the hit alignment, at most MIN_SLACK x the dense
    minimum); a sparser offload interval stores no more (0 <= 512 <= None)."""
    violations = []
    fork = {
        (
            r["geometry"],
            r["workload"],
            r["variant"],
            r["small"],
            r["gpu"],
            r["offload"],
        ): r
        for r in records
        if r["setting"] == "fork"
    }
    for (g, w, v, small, gpu, off), r in fork.items():
        where = f"{g} {w} {v}{' (scaled down)' if small else ''} {pair_name(gpu, off)}"
        if r["lost_hits"]:
            violations.append(f"{where}: {r['lost_hits']} hits lost")
        if r["store_bytes"] > r["every_store_bytes"]:
            violations.append(f"{where}: stores more than every chunk")
        if off is None and (
            r["store_bytes"] > MIN_SLACK * r["min_store_bytes"]
            if r["finer_windows"]
            else r["store_bytes"] != r["every_store_bytes"]
        ):
            violations.append(
                f"{where}: offload None stores {r['store_bytes']:,} B, every "
                f"chunk {r['every_store_bytes']:,} B, dense minimum "
                f"{r['min_store_bytes']:,} B"
            )
        if off == 0:
            b = {
                o: fork.get((g, w, v, small, gpu, o), {}).get("store_bytes")
                for o in SETTINGS
            }
            if None not in b.values() and not b[0] <= b[512] <= b[None]:
                violations.append(
                    f"{g} {w} {v} GPU {label(gpu)}: offload 0 / 512 / None store "
                    + " / ".join(f"{b[o]:,}" for o in (0, 512, None))
                    + " B, not increasing"
                )
    return violations


# --- Report ---------------------------------------------------------------------


def fmt_mib(n: float) -> str:
    return f"{n / MIB:,.1f}"


def capacity_cells(rec: dict) -> list[str]:
    """LRU / ARC hits at each fixed budget."""
    cap = rec.get("capacity")
    if not cap:
        return ["–"] * len(SHARES)
    return [f"{cap['lru'][i]:,} / {cap['arc'][i]:,}" for i in range(len(SHARES))]


def geometry_table(doc: dict, geometry: str) -> list[str]:
    records = doc["records"]
    shares = " | ".join(f"LRU / ARC @ {s:.0%}" for s in SHARES)
    lines = []
    cells = [c for c in doc["cells"] if c[0] == geometry]
    for g, w, v, small in cells:
        mine = [r for r in records if (r["geometry"], r["workload"], r["variant"])
                == (g, w, v)]  # fmt: skip
        if not mine:
            continue
        fork = [r for r in mine if r["setting"] == "fork"]
        stock = [r for r in mine if r["setting"] == "stock"]
        lines += [f"### {cell_name(g, w, v)}{' (scaled down)' if small else ''}", ""]
        if fork:
            refs = {r["gpu"]: r for r in fork if r["offload"] is None}
            lines.append(
                "Every-chunk reference at GPU None / 512 / 0: "
                + " / ".join(fmt_mib(refs[r]["every_store_bytes"]) for r in SETTINGS)
                + " MiB, probe hits "
                + " / ".join(f"{refs[r]['every_probe_hit_tokens']:,}" for r in SETTINGS)
                + f" ({fork[0]['probes']} probes)."
            )
        budgets = doc["budgets"].get(f"{g} {w}")
        if budgets and v == "default":
            bb = doc["block_bytes"].get(g)
            lines.append(
                "Fixed budgets: "
                + ", ".join(
                    f"{s:.0%} = {b:,} CPU blocks"
                    + (f" ({b * bb / 2**30:,.2f} GiB)" if bb else "")
                    for s, b in zip(SHARES, budgets)
                )
                + " of stock's dense footprint."
            )
        lines += [
            "",
            f"| GPU / offload | store MiB | fork / min | replay hits | probe hits "
            f"| lost | {shares} |",
            "|---|---:|---:|---:|---:|---:|" + "---:|" * len(SHARES),
        ]
        for r in fork:
            mark = " **(0.33.0)**" if r["diagonal"] else ""
            lines.append(
                f"| {pair_name(r['gpu'], r['offload'])}{mark} | "
                f"{fmt_mib(r['store_bytes'])} | {r['ratio_to_min']:.3f} | "
                f"{r['hit_tokens']:,} | {r['probe_hit_tokens']:,} | "
                f"{r['lost_hits']} | " + " | ".join(capacity_cells(r)) + " |"
            )
        for r in stock:
            lines.append(
                f"| stock 0.29.0, GPU {label(r['gpu'])} | {fmt_mib(r['store_bytes'])} "
                f"| – | {r['hit_tokens']:,} | {r['probe_hit_tokens']:,} | "
                f"{r['lost_hits']} | " + " | ".join(capacity_cells(r)) + " |"
            )
        for r in stock:
            o33 = r.get("stock_033")
            if o33:
                lines.append(
                    f"| stock 0.33.0, {pair_name(r['gpu'], r['gpu'])} (cited) | "
                    f"{fmt_mib(o33['store_bytes'])} | – | {o33['hit_tokens']:,} | "
                    f"{o33['probe_hit_tokens']:,} | {o33['lost_hits']}* | "
                    + " | ".join(["–"] * len(SHARES))
                    + " |"
                )
        lines.append("")
    return lines


def plot(records: list[dict], out: Path, geometry: str) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed: no plots")
        return None
    cells = list(dict.fromkeys(
        (r["workload"], r["variant"]) for r in records if r["geometry"] == geometry
    ))  # fmt: skip
    if not cells:
        return None
    cols = min(3, len(cells))
    rows = math.ceil(len(cells) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.2 * cols, 4.8 * rows),
                             squeeze=False)  # fmt: skip
    colors = {None: "C0", 512: "C1", 0: "C2"}
    for ax, (w, v) in zip(axes.flat, cells):
        mine = [r for r in records
                if (r["geometry"], r["workload"], r["variant"]) == (geometry, w, v)]  # fmt: skip
        fork = [r for r in mine if r["setting"] == "fork"]
        diag = sorted(
            (r for r in fork if r["diagonal"]), key=lambda r: r["store_bytes"]
        )
        ax.plot([r["store_bytes"] / MIB for r in diag],
                [r["probe_hit_tokens"] for r in diag], color="0.6", lw=1, ls=":",
                zorder=1)  # fmt: skip
        # One point per (store bytes, probe hits): settings that store and
        # hit alike share it and one label.
        groups: dict[tuple, list[tuple[dict, str, str]]] = {}
        for r in fork:
            name = pair_name(r["gpu"], r["offload"]).replace(" ", "")
            kind = "diagonal" if r["diagonal"] else f"offload {label(r['offload'])}"
            groups.setdefault((r["store_bytes"], r["probe_hit_tokens"]), []).append(
                (r, name, kind)
            )
        for r in (r for r in mine if r["setting"] == "stock"):
            point = (r["store_bytes"], r["probe_hit_tokens"])
            groups.setdefault(point, []).append(
                (r, f"stock {label(r['gpu'])}", "stock")
            )
            if o33 := r.get("stock_033"):
                point = (o33["store_bytes"], o33["probe_hit_tokens"])
                groups.setdefault(point, []).append(
                    (r, f"0.33.0 {label(r['gpu'])}", "0.33.0")
                )
        styles = {
            "diagonal": {"marker": "*", "s": 110, "edgecolors": "k", "zorder": 4},
            "stock": {"marker": "s", "s": 30, "color": "k", "zorder": 2},
            "0.33.0": {"marker": "^", "s": 30, "color": "0.55", "zorder": 2},
        }
        for (nbytes, hits), same in groups.items():
            for r, _, kind in same:
                style = styles.get(kind, {"marker": "o", "s": 30, "zorder": 3})
                if r["setting"] == "fork":
                    style = {**style, "color": colors[r["offload"]]}
                ax.scatter(nbytes / MIB, hits, **style)
        # Points within 1% of each other in bytes and 1% of the hit range
        # share one label; neighbouring labels alternate above and below.
        span = max(1, max(h for _, h in groups) - min(h for _, h in groups))
        clusters: list[list] = []
        for point in sorted(groups):
            last = clusters[-1][-1] if clusters else None
            if (
                last
                and point[0] <= 1.01 * last[0]
                and abs(point[1] - last[1]) <= span / 100
            ):
                clusters[-1].append(point)
            else:
                clusters.append([point])
        for i, cluster in enumerate(clusters):
            names = [name for point in cluster for _, name, _ in groups[point]]
            text = "\n".join(
                ", ".join(names[k : k + 3]) for k in range(0, len(names), 3)
            )
            ax.annotate(text, (cluster[0][0] / MIB, cluster[0][1]), fontsize=6.5,
                        xytext=(5, 4) if i % 2 == 0 else (5, -8),
                        va="bottom" if i % 2 == 0 else "top",
                        textcoords="offset points", annotation_clip=False)  # fmt: skip
        xs = [b for b, _ in groups]
        log_x = max(xs) > 5 * min(xs)
        if log_x:
            ax.set_xscale("log")
        ax.margins(x=0.3, y=0.1)
        ax.set_xlabel("offload store MiB" + (" (log)" if log_x else ""))
        ax.set_title(f"{geometry}, {cell_name(geometry, w, v)}", fontsize=10)
        ax.set_ylabel("probe hit tokens")
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(cells) :]:
        ax.axis("off")
    handles = [
        plt.Line2D([], [], marker="o", ls="", color=c, label=f"fork, offload {label(o)}")
        for o, c in colors.items()
    ] + [
        plt.Line2D([], [], marker="*", ls=":", color="0.6", markerfacecolor="w",
                   markeredgecolor="k", markersize=10,
                   label="GPU == offload (0.33.0's pairing)"),
        plt.Line2D([], [], marker="s", ls="", color="k", label="stock 0.29.0 (GPU g)"),
        plt.Line2D([], [], marker="^", ls="", color="0.55",
                   label="stock 0.33.0 (cited, g == o)"),
    ]  # fmt: skip
    fig.legend(handles=handles, fontsize=7, loc="lower center", ncol=len(handles))
    fig.suptitle("probe hits vs store bytes; points labelled GPU/offload retention "
                 "interval (settings that store and hit alike share a point)",
                 fontsize=9)  # fmt: skip
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    path = out / f"frontier_{geometry}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def document(m: dict, records, errors, args) -> dict:
    """frontier.json: what the report is rendered from."""
    block_bytes = {k[0]: x["block_bytes"] for k, x in m["capacity"].items()}
    return {
        "command": args.command,
        "seconds": m["seconds"],
        "timings": m["timings"],
        "cpus": os.cpu_count(),
        "fork_tree": str(args.fork_tree),
        "fork_version": base_version(args.fork_tree),
        "stock_tree": str(args.stock_tree),
        "cells": m["cells"],
        "shares": SHARES,
        "budgets": {f"{g} {w}": b for (g, w), b in m["budgets"].items()},
        "block_bytes": block_bytes,
        "records": records,
        "errors": errors,
        "violations": errors + check(records),
    }


def write(doc: dict, out: Path, guidance: list[str]) -> None:
    """frontier.json (with the guidance, hand-written from the tables, so that
    --render keeps it), frontier.md and the plots."""
    out.mkdir(parents=True, exist_ok=True)
    doc = {**doc, "guidance": guidance}
    (out / "frontier.json").write_text(json.dumps(doc, indent=1) + "\n")
    geometries = list(dict.fromkeys(c[0] for c in doc["cells"]))
    md = [
        "# The measured frontier: GPU retention x offload retention",
        "",
        f"Generated by `{doc['command']}` in {doc['seconds']:,} s on "
        f"{doc['cpus']} CPUs, one process at a time unless noted ("
        + ", ".join(f"{k} {v:,} s" for k, v in doc["timings"].items())
        + "); `python -m bench.frontier --render bench/results/frontier.json` "
        "renders this file again from the records. The fork is vLLM "
        f"{doc['fork_version']} + `patches/` (`{doc['fork_tree']}`), "
        "with the OffloadingConnector's own retention interval "
        "(`kv_connector_extra_config.retention_interval`) set apart from the GPU "
        "prefix cache's (`prefix_cache_retention_interval`); every run recorded "
        "the interval the connector used, and the driver fails a run whose "
        "interval is not the one asked for. One repetition, no cost timing.",
        "",
        "Columns: *GPU / offload* = the two intervals; **(0.33.0)** marks the "
        "diagonal, one interval for both tiers, which is upstream 0.33.0's "
        "behaviour; *store MiB* = offload store bytes of the workload; *fork / "
        "min* = against the theoretical minimum at the offload interval "
        "(`bench/driver.py` `boundaries`; with decode offloading on the stored "
        "prompt + output: replay, prompt end, the stored end where a follow-up "
        "extending prompt + output hits, shared-prefix hits and junctions, "
        "multiples of 512 up to the stored end); *replay hits* = external hit "
        "tokens of every request replayed alone with an empty GPU prefix cache; "
        "*probe hits* = the same for requests sharing exactly one aligned prefix "
        "of a stored sequence (prompt and output regions); *lost* = replays and "
        "probes at a boundary the GPU prefix cache retains at the OFFLOAD "
        "interval (every one with None; replay boundaries and multiples of 512 "
        "with 512; replay boundaries with 0) that hit less than the every-chunk "
        "reference at the same GPU interval (the fork with its masks off), i.e. "
        "the offload tier at interval o serves at least what vLLM's GPU prefix "
        "cache at o serves; stock 0.29.0 rows: lost at its GPU interval. "
        "*LRU / ARC @ share* = replay hit tokens with vLLM's "
        "`CPUOffloadingSpec` (`cpu_bytes_to_use` = that share of stock 0.29.0's "
        "dense footprint for the geometry and workload, the most CPU blocks its "
        "stores take at any GPU interval) and the LRU / ARC eviction policy; a "
        "budget holding all of a setting's blocks never evicts, its hits are "
        "the replay hits. Stock 0.33.0 rows are cited from "
        "`bench/results/0.33.0/summary.json` (stock 0.33.0, GPU and offload at "
        "one interval; *lost* there, marked \\*, is against 0.33.0's own "
        "every-chunk reference), not rerun.",
        "",
    ]
    defaults = {f"{c[0]} {c[1]}" for c in doc["cells"] if c[2] == "default"}
    if doc["budgets"] and set(doc["budgets"]) != defaults:
        md += [
            "Capacity was run on " + ", ".join(doc["budgets"]) + " only (fewer "
            "cells, to keep the run short: bytes and hits alone took "
            f"{sum(v for k, v in doc['timings'].items() if 'capacity' not in k):,} s "
            "here).",
            "",
        ]
    for geometry in geometries:
        md += [f"## {geometry}", ""]
        md += geometry_table(doc, geometry)
        path = plot(doc["records"], out, geometry)
        if path:
            md += [f"![{geometry}]({path.name})", ""]
    md += ["## Invariant violations", ""]
    md += [f"- {v}" for v in doc["violations"]] or ["none"]
    md += ["", *guidance]
    (out / "frontier.md").write_text("\n".join(md) + "\n")


def print_summary(records: list[dict]) -> None:
    for r in records:
        pair = (
            pair_name(r["gpu"], r["offload"])
            if r["setting"] == "fork"
            else f"stock {label(r['gpu'])}"
        )
        ratio = f"{r['ratio_to_min']:.3f}x min" if "ratio_to_min" in r else ""
        print(
            f"{r['geometry']} {r['workload']} {r['variant']} {pair}: "
            f"{fmt_mib(r['store_bytes'])} MiB {ratio}, replay {r['hit_tokens']:,}, "
            f"probes {r['probe_hit_tokens']:,}, lost {r['lost_hits']}"
            + (f", capacity {r['capacity']}" if r.get("capacity") else "")
        )


def main(argv=None) -> int:
    if argv is None and sys.argv[1:2] == ["--worker"]:
        worker(Path(sys.argv[2]), Path(sys.argv[3]))
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--scaled-down", action="store_true",
                   help="every cell scaled down, the whole pipeline")  # fmt: skip
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--stock-tree", type=Path, default=ROOT / "build/stock/vllm")
    p.add_argument("--fork-tree", type=Path, default=ROOT / "upstream/vllm")
    p.add_argument("--geometries", nargs="+", default=list(BUILDERS),
                   choices=list(BUILDERS))  # fmt: skip
    p.add_argument("--capacity-geometries", nargs="+", default=list(BUILDERS),
                   choices=list(BUILDERS))  # fmt: skip
    p.add_argument("--capacity-from", type=Path, default=None,
                   metavar="FRONTIER_JSON",
                   help="add the fixed-budget runs of --capacity-geometries to "
                        "a finished run's records (bytes and hits not rerun)")  # fmt: skip
    p.add_argument("--guidance", type=Path, default=None,
                   help="markdown appended to frontier.md (operator guidance); "
                        "kept in frontier.json for --render")  # fmt: skip
    p.add_argument("--render", type=Path, default=None, metavar="FRONTIER_JSON",
                   help="render frontier.md and the plots from a run's records")  # fmt: skip
    args = p.parse_args(argv)
    guidance = args.guidance.read_text().splitlines() if args.guidance else []
    if args.render:
        doc = json.loads(args.render.read_text())
        doc["violations"] = doc.get("errors", []) + check(doc["records"])
        write(doc, args.out or args.render.parent, guidance or doc.get("guidance", []))
        return 0
    args.command = "python -m bench.frontier " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    args.stock_tree, args.fork_tree = (
        args.stock_tree.resolve(),
        args.fork_tree.resolve(),
    )
    if args.capacity_from:
        doc = add_capacity(args)
        doc["violations"] = doc.get("errors", []) + check(doc["records"])
        out = args.out or args.capacity_from.parent
        write(doc, out, guidance or doc.get("guidance", []))
        log(f"wrote {out}/frontier.md, frontier.json, frontier_*.png")
        return 1 if doc["violations"] else 0
    m = measure(args)
    records, errors = analyse(m)
    violations = errors + check(records)
    print_summary(records)
    out = args.out or (None if args.quick else RESULTS)
    if out:
        write(document(m, records, errors, args), out, guidance)
        log(f"wrote {out}/frontier.md, frontier.json, frontier_*.png")
    log(f"{m['seconds']} s")
    if violations:
        print("\nINVARIANT VIOLATIONS:\n" + "\n".join(f"  {v}" for v in violations))
        return 1
    print("\nall invariants hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
