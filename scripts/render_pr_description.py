# SPDX-License-Identifier: Apache-2.0
"""Render the upstream PR description (scripts/export_upstream_pr.sh): the
base's own .github/PULL_REQUEST_TEMPLATE.md with each "## Heading" filled
from the same section of upstream-pr/description.md, where these
placeholders become measured tables:

  {{bench}}          stock vs stock + series on the base, one benchmark run
                     (bench/results/<base>/summary.json): store bytes, hits
                     lost against the every-chunk reference, scheduler cost
  {{capacity}}       hits against vLLM's CPU offload manager with a byte
                     budget, stock vs stock + series on the base
                     (bench/results/<base>/capacity.md, python -m bench.capacity)
  {{replay_cases}}   upstream-pr/replay_cases.md (the defect cases
                     before/after, from bench/replay_cases.py)
  {{tests}}          pass/fail counts of the test command's JUnit reports
                     for this base (build/test-results), when present
  {{base}}           the base release

The first line of description.md ("# title") is the PR title; the section
"## Overview" also becomes the cover letter's blurb (--cover)."""

import argparse
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def sections(text: str) -> tuple[str, dict[str, str]]:
    title, *parts = re.split(r"^## ", text, flags=re.M)
    out = {}
    for part in parts:
        heading, _, body = part.partition("\n")
        out[heading.strip()] = body.strip()
    return title.strip().removeprefix("# ").strip(), out


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f}"


def bench_table(base: str) -> str:
    path = ROOT / "bench" / "results" / base / "summary.json"
    if not path.exists():
        raise SystemExit(
            f"{path} is missing: run FORK_BASE={base} scripts/bench_store.sh"
        )
    rows = [
        "| geometry / workload | GPU retention | stock MiB | PR MiB | saved "
        "| lost hits stock / PR | scheduler CPU PR / stock (min-max) |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for r in json.loads(path.read_text()):
        cell = f"{r['geometry']} / {r['workload']}"
        if r["variant"] != "default":
            cell += f" / {r['variant']}"
        lo, hi = r["sched_cost_spread"]
        rows.append(
            f"| {cell} | {'None' if r['retention'] is None else r['retention']} "
            f"| {mib(r['stock_store_bytes'])} | {mib(r['store_bytes'])} "
            f"| {1 - r['store_bytes'] / r['stock_store_bytes']:.1%} "
            f"| {r['stock_lost_hits']} / {r['lost_hits']} "
            f"| {r['sched_cost_ratio']:.3f} ({lo:.2f}-{hi:.2f}) |"
        )
    return "\n".join(rows)


def capacity_table(base: str) -> str:
    """The per-pair table of capacity.md and its note."""
    path = ROOT / "bench" / "results" / base / "capacity.md"
    if not path.exists():
        raise SystemExit(
            f"{path} is missing: run python -m bench.capacity with the {base} trees"
        )
    text = path.read_text().split("## Every geometry and workload", 1)[-1]
    return text.split("![", 1)[0].strip()


def tests_table(results: Path, base: str) -> str:
    rows = ["| check | passed | failed |", "|---|---:|---:|"]
    for name in (f"series-upstream-pr-{base}", f"upstream-pr-{base}"):
        report = results / f"{name}.xml"
        if not report.exists():
            continue
        passed = failed = 0
        for case in ET.parse(report).iter("testcase"):
            bad = {c.tag for c in case} & {"failure", "error", "skipped"}
            failed += bool(bad)
            passed += not bad
        rows.append(f"| {name} | {passed} | {failed} |")
    if len(rows) == 2:
        return "(run `scripts/test.sh` first for the counts)"
    return "\n".join(rows)


def replay_cases(path: Path) -> str:
    if not path.exists():
        raise SystemExit(
            f"{path} is missing: run bench/replay_cases.py on the base's stock tree "
            "and its series tree (the command is in upstream-pr/replay_cases.md)"
        )
    # Its "## Regenerate" section (the fork's commands) stays in the fork.
    return re.sub(r"\n## Regenerate\b.*\Z", "\n", path.read_text(), flags=re.S)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", required=True)
    parser.add_argument("--tree", type=Path, required=True)
    parser.add_argument("--description", type=Path, required=True)
    parser.add_argument("--replay-cases", type=Path, required=True)
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cover", type=Path, required=True)
    args = parser.parse_args()

    title, ours = sections(args.description.read_text())
    values = {
        "base": args.base,
        "bench": bench_table(args.base),
        "capacity": capacity_table(args.base),
        # Its own title would be a second H1 inside the description.
        "replay_cases": re.sub(r"\A# .*\n+", "", replay_cases(args.replay_cases)).strip(),
        "tests": tests_table(args.results, args.base),
    }
    for heading, body in ours.items():
        ours[heading] = re.sub(r"\{\{(\w+)\}\}", lambda m: values[m.group(1)], body)

    template = (args.tree / ".github" / "PULL_REQUEST_TEMPLATE.md").read_text()
    wanted = re.findall(r"^## (.+)$", template, flags=re.M)
    missing = [h for h in wanted if h not in ours]
    extra = [h for h in ours if h not in wanted]
    if missing or extra:
        raise SystemExit(
            f"{args.description} does not match the template of vLLM {args.base}: "
            f"missing sections {missing}, sections the template lacks {extra}"
        )

    def fill(m: re.Match) -> str:
        return f"## {m.group(1)}\n\n{ours[m.group(1)]}\n"

    # Each heading's placeholder comment is replaced by our section.
    body = re.sub(r"^## ([^\n]+)\n\n<!--.*?-->\n", fill, template, flags=re.M | re.S)
    args.out.write_text(f"<!-- PR title: {title} -->\n\n{body}")
    args.cover.write_text(f"{title}\n\n{ours[wanted[0]]}\n")


if __name__ == "__main__":
    main()
