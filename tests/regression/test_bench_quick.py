# SPDX-License-Identifier: Apache-2.0
"""The store-traffic benchmark's quick mode (scripts/bench_store.sh --quick):
the fork's sparse stores on real model geometries against stock 0.29.0 --
store-byte reduction on the DeepSeek-V4 headline, hits equal to dense at
retained boundaries, bytes within 1% of the theoretical minimum. About 80 s."""

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
def test_bench_store_quick():
    proc = subprocess.run(
        [str(ROOT / "scripts" / "bench_store.sh"), "--quick"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = proc.stdout[-6000:]
    assert proc.returncode == 0, report + proc.stderr[-3000:]
    assert "all invariants hold" in proc.stdout
