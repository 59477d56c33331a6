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
"## Overview" also becomes the cover letter's blurb (--cover).

With --stack and --patches, it also writes one PR description per commit
(--prs DIR/NNNN.md), for sending each commit as a PR of its own: the
overview and the commits it follows from upstream-pr/stack.md, the commit's
message as its claims, and its test files as the validation."""

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


def fill_template(template: str, title: str, ours: dict[str, str]) -> str:
    """The template with each heading's placeholder comment replaced by our
    section of that heading."""

    def fill(m: re.Match) -> str:
        return f"## {m.group(1)}\n\n{ours[m.group(1)]}\n"

    body = re.sub(r"^## ([^\n]+)\n\n<!--.*?-->\n", fill, template, flags=re.M | re.S)
    return f"<!-- PR title: {title} -->\n\n{body}"


def stack(path: Path) -> dict[str, tuple[str, str]]:
    """upstream-pr/stack.md: commit number -> (commits it follows, overview)."""
    rows = re.findall(r"^\| (\d{4}) \| ([^|]+) \| (.+) \|$", path.read_text(), re.M)
    return {n: (after.strip(), overview.strip()) for n, after, overview in rows}


def commit_message(patch: str) -> tuple[str, str]:
    """(subject, body) of a `git format-patch` file."""
    header, _, rest = patch.partition("\n\n")
    subject = re.search(r"^Subject: (.*(?:\n .*)*)", header, re.M)
    if subject is None:
        raise SystemExit("a patch without a Subject: header")
    title = re.sub(r"^\[PATCH[^\]]*\] ", "", " ".join(subject[1].split()))
    body = rest.split("\n---\n", 1)[0]
    body = re.sub(r"^Signed-off-by: .*\n?", "", body, flags=re.M)
    return title, body.strip()


def commit_prs(
    template: str, rows: dict[str, tuple[str, str]], patches: list[Path], base: str
) -> dict[str, str]:
    """One PR description per exported commit, in the base's template."""
    numbers = [p.name[:4] for p in patches]
    if sorted(rows) != numbers:
        raise SystemExit(
            f"upstream-pr/stack.md lists commits {sorted(rows)}, "
            f"the series has {numbers}"
        )
    wanted = re.findall(r"^## (.+)$", template, flags=re.M)
    if wanted != ["Overview", "Claims", "Validation", "Details"]:
        raise SystemExit(f"vLLM {base}'s PR template has sections {wanted}")
    out = {}
    for patch in patches:
        number, text = patch.name[:4], patch.read_text()
        title, body = commit_message(text)
        after, overview = rows[number]
        tests = sorted(set(re.findall(r"^diff --git a/(tests/\S+\.py) ", text, re.M)))
        order = (
            "It applies alone on the release."
            if after == "none"
            else f"Stacked: it follows the PRs of commits {after} of this series."
        )
        added = re.findall(r"^\+\s*def (test_\w+)\(", text, re.M)
        if tests:
            validation = (
                (
                    f"New tests: {', '.join(f'`{t}`' for t in added)}.\n\n"
                    if added
                    else ""
                )
                + f"The test files this commit changes, on vLLM {base}'s CPU "
                "platform:\n\n```bash\npytest -m cpu_test " + " ".join(tests) + "\n```"
            )
        else:
            validation = (
                "No test changes: the existing suites pass unchanged "
                "(`pytest -m cpu_test tests/v1/kv_connector/unit tests/v1/core`)."
            )
        ours = {
            "Overview": f"{overview}\n\n{order}",
            "Claims": body,
            "Validation": validation,
            "Details": (
                f"Commit {number} of {len(patches)} of the offloading sparse-store "
                "series; its measurements as a whole (store bytes, lost hits, "
                "scheduler cost, defect cases before and after) are in the "
                "series' cover description."
            ),
        }
        out[number] = fill_template(template, title, ours)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", required=True)
    parser.add_argument("--tree", type=Path, required=True)
    parser.add_argument("--description", type=Path, required=True)
    parser.add_argument("--replay-cases", type=Path, required=True)
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cover", type=Path, required=True)
    parser.add_argument("--stack", type=Path, help="upstream-pr/stack.md")
    parser.add_argument("--patches", type=Path, help="the exported patches")
    parser.add_argument("--prs", type=Path, help="where NNNN.md go")
    args = parser.parse_args()
    if args.stack and not (args.patches and args.prs):
        parser.error("--stack needs --patches and --prs")

    title, ours = sections(args.description.read_text())
    values = {
        "base": args.base,
        "bench": bench_table(args.base),
        "capacity": capacity_table(args.base),
        # Its own title would be a second H1 inside the description.
        "replay_cases": re.sub(
            r"\A# .*\n+", "", replay_cases(args.replay_cases)
        ).strip(),
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

    args.out.write_text(fill_template(template, title, ours))
    args.cover.write_text(f"{title}\n\n{ours[wanted[0]]}\n")
    if args.stack:
        args.prs.mkdir(parents=True, exist_ok=True)
        patches = [
            p
            for p in sorted(args.patches.glob("[0-9][0-9][0-9][0-9]-*.patch"))
            if not p.name.startswith("0000-")  # the cover letter
        ]
        for name, text in commit_prs(
            template, stack(args.stack), patches, args.base
        ).items():
            (args.prs / f"{name}.md").write_text(text)


if __name__ == "__main__":
    main()
