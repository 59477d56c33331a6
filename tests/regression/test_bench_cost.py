# SPDX-License-Identifier: Apache-2.0
"""The benchmark's cost figure (bench/run.py cost_floor): each step's hook
time at its minimum over the repetitions, summed, per scheduled token."""

import pytest

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
