# SPDX-License-Identifier: Apache-2.0
"""Does the scheduler cost figure reproduce? Compare two benchmark runs
(their summary.json, or the OUT.json of two `bench.cost_trees` runs of a
stock tree and one fork tree) cell by cell: the fork / stock cost ratio of each, the
relative difference between the runs, and whether it is within the
tolerance; where the runs recorded them, how much each side's CPU ns per
token moved (which tree's floor a miss comes from). Store bytes and hits
must be identical (they are deterministic).

    python -m bench.compare_runs RUN_A/summary.json RUN_B/summary.json [--out FILE.md]
    python -m bench.compare_runs COST_A.json COST_B.json [--out FILE.md]
"""

import argparse
import json
from pathlib import Path

TOLERANCE = 0.03


def cells(path: Path) -> dict[tuple, dict]:
    data = json.loads(path.read_text())
    if isinstance(data, dict):
        # bench.cost_trees: {"geometry:workload:variant:retention": {tree:
        # {"floor", "bytes"}}}, the stock tree first and one fork tree.
        def record(trees: dict) -> dict:
            if len(trees) != 2:
                raise SystemExit(f"{path}: compare two trees, not {list(trees)}")
            base, fork = trees.values()
            return {
                "store_bytes": fork["bytes"],
                "sched_cost_ratio": fork["floor"] / base["floor"],
                "stock_cpu_ns_per_token": base["floor"],
                "cpu_ns_per_token": fork["floor"],
            }

        return {tuple(k.split(":")): record(v) for k, v in data.items()}
    return {
        (r["geometry"], r["workload"], r["variant"], str(r["retention"])): r
        for r in data
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    a, b = cells(args.a), cells(args.b)
    if a.keys() != b.keys():
        raise SystemExit("the runs cover different cells")
    lines = [
        f"# Scheduler cost: two runs ({args.a.parent.name} vs {args.b.parent.name})\n",
        "| cell | GPU retention | cost A | cost B | B / A - 1 | within "
        f"{TOLERANCE:.0%} | stock ns/token B / A - 1 | fork ns/token B / A - 1 |",
        "|---|---|---:|---:|---:|---|---:|---:|",
    ]
    within = 0
    for key in sorted(a, key=str):
        ra, rb = a[key], b[key]
        for field in ("store_bytes", "hit_tokens", "lost_hits"):
            if field in ra and ra[field] != rb.get(field):
                raise SystemExit(f"{key}: {field} differs ({ra[field]} vs {rb[field]})")
        diff = rb["sched_cost_ratio"] / ra["sched_cost_ratio"] - 1
        ok = abs(diff) <= TOLERANCE
        within += ok
        g, w, v, r = key
        sides = [
            f"{rb[f] / ra[f] - 1:+.1%}" if f in ra and f in rb else "–"
            for f in ("stock_cpu_ns_per_token", "cpu_ns_per_token")
        ]
        lines.append(
            f"| {g} / {w} / {v} | {r} | {ra['sched_cost_ratio']:.3f}x "
            f"| {rb['sched_cost_ratio']:.3f}x | {diff:+.1%} | {'yes' if ok else 'no'} "
            f"| {' | '.join(sides)} |"
        )
    lines.append(f"\n{within} of {len(a)} cells agree within {TOLERANCE:.0%}.")
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0 if within == len(a) else 1


if __name__ == "__main__":
    raise SystemExit(main())
