# SPDX-License-Identifier: Apache-2.0
"""The benchmark's cost figure (bench/run.py cost_floor): each step's hook
time at its minimum over the repetitions, summed, per scheduled token; and
the comparison of two runs' figures (bench/compare_runs.py)."""

import json
import sys

import pytest

from bench import compare_runs
from bench.run import cost_floor


def test_each_step_is_taken_at_its_minimum():
    # Step 1 was slowed down in repetition 1, step 2 in repetition 2, step 3
    # in repetition 3: the floor is what no repetition was slowed down in.
    steps = [[10, 50, 30], [40, 20, 30], [10, 20, 90]]
    assert cost_floor(steps, tokens=6) == (10 + 20 + 30) / 6


def test_a_single_repetition_is_its_own_floor():
    assert cost_floor([[7, 5]], tokens=4) == 3


def test_repetitions_that_took_different_steps_are_refused():
    with pytest.raises(SystemExit, match="different steps"):
        cost_floor([[1, 2], [1]], tokens=1)


def _cost_trees_run(tmp_path, name: str, stock: float, fork: float, nbytes: int):
    path = tmp_path / f"{name}.json"
    cell = {
        "stock": {"floor": stock, "bytes": 9},
        "fork": {"floor": fork, "bytes": nbytes},
    }
    path.write_text(json.dumps({"gpt-oss-20b:agentic:decode:0": cell}))
    return path


def test_two_cost_trees_runs_compare_by_their_ratio(tmp_path, monkeypatch, capsys):
    a = _cost_trees_run(tmp_path, "a", stock=1000, fork=800, nbytes=5)
    # Both trees 10% slower: the ratio holds, the cell agrees.
    b = _cost_trees_run(tmp_path, "b", stock=1100, fork=880, nbytes=5)
    c = _cost_trees_run(tmp_path, "c", stock=1000, fork=840, nbytes=5)
    monkeypatch.setattr(sys, "argv", ["compare_runs", str(a), str(b)])
    assert compare_runs.main() == 0
    assert (
        "| 0.800x | 0.800x | +0.0% | yes | +10.0% | +10.0% |" in capsys.readouterr().out
    )
    monkeypatch.setattr(sys, "argv", ["compare_runs", str(a), str(c)])
    assert compare_runs.main() == 1  # 5% apart
    d = _cost_trees_run(tmp_path, "d", stock=1000, fork=800, nbytes=6)
    monkeypatch.setattr(sys, "argv", ["compare_runs", str(a), str(d)])
    with pytest.raises(SystemExit, match="store_bytes differs"):
        compare_runs.main()
