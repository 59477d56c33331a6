# SPDX-License-Identifier: Apache-2.0
"""The offload-capacity benchmark's quick mode (python -m bench.capacity
--quick) at retention 0 only, to stay near a minute: vLLM's own CPU offload
manager with a byte budget on the DeepSeek-V4 GSM8K-like headline, scaled
down. Checks that the unlimited budget hits what the unlimited recorder hits,
that hits do not fall as the budget grows, and that the fork at 0 needs less
budget than stock for 90% of its hits."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STOCK = ROOT / "build" / "stock"


def stock_tree() -> Path:
    """Stock 0.29.0, empty series, as scripts/bench_store.sh builds it
    (idempotent: seconds once the release is cached)."""
    (STOCK / "patches").mkdir(parents=True, exist_ok=True)
    (STOCK / "patches" / "series").touch()
    env = dict(os.environ, FORK_PATCHES=str(STOCK / "patches"),
               FORK_TREE=str(STOCK / "vllm"))  # fmt: skip
    for script in ("fetch_upstream.sh", "apply_series.sh"):
        subprocess.run([ROOT / "scripts" / script], env=env, check=True,
                       capture_output=True, timeout=300)  # fmt: skip
    return STOCK / "vllm"


@pytest.mark.e2e
def test_bench_capacity_quick(tmp_path):
    cmd = [sys.executable, "-m", "bench.capacity", "--quick", "--retentions", "0",
           "--stock-tree", stock_tree(), "--out", tmp_path]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = json.loads((tmp_path / "capacity.json").read_text())
    assert (tmp_path / "capacity.png").stat().st_size > 0
    assert {(r["setting"], r["policy"]) for r in records} == {
        (s, p) for s in ("stock", "fork") for p in ("lru", "arc")
    }
    keep90 = {}
    for r in records:
        assert r["unlimited_hits"] == r["recorder_hits"] > 0, r["setting"]
        hits = [p["hits"] for p in r["points"] if p["budget_blocks"] is not None]
        assert all(b >= a - 0.1 * r["unlimited_hits"] for a, b in zip(hits, hits[1:]))
        assert max(hits) == r["unlimited_hits"]
        keep90[(r["setting"], r["policy"])] = r["keep90"]["bytes"]
    for policy in ("lru", "arc"):
        assert keep90[("fork", policy)] < keep90[("stock", policy)]


def _record(setting: str, points: dict) -> dict:
    return {
        "geometry": "g", "workload": "w", "retention": 0, "policy": "lru",
        "setting": setting,
        "points": [{"budget_blocks": b, "budget_bytes": (b or 0) * 2**20, "hits": h}
                   for b, h in points.items()],
    }  # fmt: skip


def test_every_budget_below_stock_is_listed():
    from bench.capacity import below_stock

    # Budget 10: fork below stock. 20: above. 30: bisection point stock never
    # ran (not comparable). None: unlimited, equal by construction, excluded.
    stock = _record("stock", {None: 100, 10: 50, 20: 60})
    fork = _record("fork", {None: 100, 10: 40, 20: 70, 30: 10})
    report = below_stock([stock, fork])
    assert "at 1 of 2 budgets" in report
    rows = [line for line in report.splitlines() if line.startswith("| g |")]
    assert rows == ["| g | w | 0 | lru | 0.010 | 50 | 40 | 0.800x |"]


def test_no_row_when_the_fork_never_hits_less():
    from bench.capacity import below_stock

    stock = _record("stock", {None: 100, 10: 50})
    report = below_stock([stock, _record("fork", {None: 100, 10: 50})])
    assert "at 0 of 1 budgets" in report and "| g |" not in report
