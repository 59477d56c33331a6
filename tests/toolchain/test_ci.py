# SPDX-License-Identifier: Apache-2.0
"""The ci/ pipelines cannot run here: lint them (actionlint, zizmor), and
check that the GPU job's script runs what tests/upstream_deselect.txt sets
aside for want of CUDA; the PR description leaves the fork's commands out."""

import importlib.util
import re
import subprocess

from conftest import ROOT


def test_workflows_lint_clean():
    r = subprocess.run(
        ["bash", str(ROOT / "ci" / "lint.sh")], capture_output=True, text=True, timeout=600
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
    r = subprocess.run(["bash", "-n", str(ROOT / "ci" / "gpu_tests.sh")], capture_output=True)
    assert r.returncode == 0
    # The same selection the script makes.
    sel = subprocess.run(
        ["bash", "-c",
         "grep -Ei '#.*(cuda|gpu)' tests/upstream_deselect.txt | "
         "sed -e 's/[[:space:]]*#.*//' -e 's/\\[.*\\]$//' | sort -u"],
        capture_output=True, text=True, cwd=ROOT,
    ).stdout.split()  # fmt: skip
    assert "tests/v1/kv_connector/unit/test_offloading_connector.py::test_cpu_offloading_metrics" in sel
    assert "grep -Ei '#.*(cuda|gpu)'" in (ROOT / "ci" / "gpu_tests.sh").read_text()


def test_pr_description_leaves_the_fork_commands_out():
    """The defect-case tables go into the PR description without their
    "## Regenerate" section (the fork's paths and scripts), and each file
    has one."""
    spec = importlib.util.spec_from_file_location(
        "render_pr_description", ROOT / "scripts" / "render_pr_description.py"
    )
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    for path in (ROOT / "upstream-pr").glob("**/replay_cases.md"):
        assert "\n## Regenerate\n" in path.read_text(), path
        text = render.replay_cases(path)
        assert "| case | probe |" in text, path
        assert "Regenerate" not in text and "bench.replay_cases" not in text, path
