# SPDX-License-Identifier: Apache-2.0
"""The measured frontier's quick mode (python -m bench.frontier --quick):
the fork's GPU x offload retention grid ({None, 512, 0}^2) on scaled-down
DeepSeek-V4 GSM8K-like, gpt-oss-20b agentic with decode offloading and
Granite-4.0-H agentic, against the every-chunk reference at each GPU
interval. About 80 s. And the driver's guard: a run whose offload interval
the connector does not honour raises instead of producing a table."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = [None, 512, 0]


@pytest.fixture(scope="module")
def frontier(tmp_path_factory):
    out = tmp_path_factory.mktemp("frontier")
    proc = subprocess.run(
        [sys.executable, "-m", "bench.frontier", "--quick", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "all invariants hold" in proc.stdout
    assert (out / "frontier.md").stat().st_size > 0
    return json.loads((out / "frontier.json").read_text())


def _fork(doc: dict) -> dict[tuple, dict]:
    return {
        (r["geometry"], r["workload"], r["variant"], r["gpu"], r["offload"]): r
        for r in doc["records"]
        if r["setting"] == "fork"
    }


@pytest.mark.e2e
def test_every_pair_of_the_grid_is_measured_at_its_own_offload_interval(frontier):
    fork = _fork(frontier)
    cells = {k[:3] for k in fork}
    assert len(cells) == 3
    assert set(fork) == {(*c, g, o) for c in cells for g in SETTINGS for o in SETTINGS}
    for (*_, gpu, off), r in fork.items():
        assert r["offload_effective"] == off, (gpu, off)
        assert r["diagonal"] == (gpu == off)


@pytest.mark.e2e
def test_no_pair_loses_a_hit_at_its_offload_interval(frontier):
    for k, r in _fork(frontier).items():
        assert r["lost_hits"] == 0, k
        assert r["probes"] > 0 and r["hit_tokens"] > 0, k
    assert frontier["violations"] == []


@pytest.mark.e2e
def test_offload_none_stores_every_chunk_a_hit_can_use(frontier):
    """Offload None stores every chunk: the every-chunk reference's bytes,
    except where sliding-window chunks are finer than the hit alignment
    (DeepSeek-V4: 4-64-token chunks, hits on 256-token edges), whose chunks
    outside every window before an aligned hit serve no hit: there the
    dense minimum, the windows before every aligned boundary (within the
    benchmark's 1% slack: the tails GPU hits are served from). Either way
    it hits what the reference hits on every replay and probe."""
    from bench.run import MIN_SLACK

    for (g, w, v, gpu, off), r in _fork(frontier).items():
        if off is not None:
            continue
        assert r["probe_hit_tokens"] == r["every_probe_hit_tokens"], (g, gpu)
        assert r["hit_tokens"] == r["every_hit_tokens"], (g, gpu)
        assert r["finer_windows"] == (g == "deepseek-v4-flash"), g
        if r["finer_windows"]:
            assert r["store_bytes"] <= MIN_SLACK * r["min_store_bytes"], gpu
            assert r["store_bytes"] < r["every_store_bytes"] / 10, gpu
        else:
            assert r["store_bytes"] == r["every_store_bytes"], (g, gpu)


@pytest.mark.e2e
def test_a_sparser_offload_interval_stores_no_more(frontier):
    fork = _fork(frontier)
    for g, w, v in {k[:3] for k in fork}:
        for gpu in SETTINGS:
            b = {o: fork[(g, w, v, gpu, o)]["store_bytes"] for o in SETTINGS}
            assert b[0] <= b[512] <= b[None], (g, w, gpu, b)
    # The offload interval, not the GPU's, decides the stores: dense GPU
    # cache, sparse offload tier on DeepSeek-V4's sliding windows.
    ds = {o: fork[("deepseek-v4-flash", "gsm8k", "default", None, o)] for o in SETTINGS}
    assert ds[0]["store_bytes"] < ds[512]["store_bytes"] < ds[None]["store_bytes"]


def test_an_offload_interval_the_connector_ignores_fails_the_run():
    """A tree whose connector ignores the key (it runs at the GPU's
    interval) must not yield a table: the driver raises before measuring."""
    from bench import driver
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import scheduler

    config_cls = scheduler.SchedulerOffloadConfig
    from_spec = config_cls.from_spec

    def ignoring_the_key(spec, vllm_config, kv_cache_config):
        config = from_spec(spec, vllm_config, kv_cache_config)
        gpu = vllm_config.cache_config.prefix_cache_retention_interval
        if dataclasses.is_dataclass(config):
            return dataclasses.replace(config, retention_interval=gpu)
        return config._replace(retention_interval=gpu)

    run = {"geometry": "granite-4.0-h-1b", "workload": "gsm8k",
           "variant": "default", "small": True, "retention": None,
           "offload_retention": 0, "tree": "fork", "probe": False}  # fmt: skip
    with mock.patch.object(config_cls, "from_spec", ignoring_the_key):
        with pytest.raises(driver.OffloadRetentionMismatch, match="uses None"):
            driver.run(run, quick=True)
    # Honoured, the same run goes through at the interval it asked for.
    result = driver.run(run, quick=True)
    assert result["offload_retention_effective"] == 0


def test_capacity_from_adds_fixed_budgets_to_a_finished_run(tmp_path):
    """--capacity-from: footprints measured again (a record's may count its
    probes' keys), budgets from stock's, jobs from each setting's footprint
    and the record's replay hits, results merged into the records of the
    geometries it ran, the others' capacity kept."""
    from bench import frontier

    def rec(g, setting, gpu, off, capacity=None):
        return {"geometry": g, "workload": "gsm8k", "variant": "default",
                "small": False, "setting": setting, "gpu": gpu, "offload": off,
                "footprint_blocks": 10**6, "hit_tokens": 50,
                "capacity": capacity}  # fmt: skip

    kept = {"lru": [1, 2], "arc": [3, 4]}
    records = [rec("a", "stock", r, None) for r in SETTINGS]
    records += [rec("a", "fork", g, o) for g, o in frontier.PAIRS]
    records += [rec("b", "stock", r, None, kept) for r in SETTINGS]
    cells = [["a", "gsm8k", "default", False], ["b", "gsm8k", "default", False]]
    doc = {"command": "python -m bench.frontier", "seconds": 10,
           "timings": {"fork capacity": 7}, "cells": cells,
           "budgets": {"b gsm8k": [1, 4]}, "block_bytes": {"b": 2},
           "records": records}  # fmt: skip
    path = tmp_path / "frontier.json"
    path.write_text(json.dumps(doc))

    runs, jobs = [], []

    def fake_run_trees(tree, batch, what):
        if what == "footprints":
            runs.extend(batch)
            # Pass 1's keys: stock 1,000 (1,512 at GPU 512), the fork 10.
            return [{**r, "stored_chunks": {0: 10} if r["tree"] == "fork" else
                     {0: 1000 + (r["retention"] or 0), 1: 0}} for r in batch]  # fmt: skip
        jobs.extend(batch)
        return [
            {**j, "block_bytes": 8,
             "points": {p: [{"hits": j["unlimited"]["hits"] - i} for i, _ in
                            enumerate(j["budgets"])] for p in j["policies"]}}
            for j in batch
        ]  # fmt: skip

    args = frontier.argparse.Namespace(
        capacity_from=path, capacity_geometries=["a"], command="cmd",
        fork_tree=tmp_path / "fork", stock_tree=tmp_path / "stock",
    )  # fmt: skip
    with mock.patch.object(frontier, "run_trees", fake_run_trees):
        out = frontier.add_capacity(args)
    # 9 fork pairs and 3 stock settings of geometry a, no probes; b not rerun.
    assert len(runs) == 12 and not any(r["probe"] for r in runs)
    assert {r["geometry"] for r in runs} == {"a"}
    assert len(jobs) == 12 and {j["geometry"] for j in jobs} == {"a"}
    # SHARES of stock's densest footprint (GPU 512: 1,512 blocks).
    assert all(j["budgets"] == [151, 756] for j in jobs)
    fork = [j for j in jobs if j["tree"] == "fork"]
    assert {(j["gpu_retention"], j["offload_retention"]) for j in fork} == set(
        frontier.PAIRS
    )
    assert all(j["unlimited"] == {"blocks": 10, "hits": 50} for j in fork)
    assert out["budgets"] == {"b gsm8k": [1, 4], "a gsm8k": [151, 756]}
    assert out["block_bytes"] == {"b": 2, "a": 8}
    for r in out["records"]:
        a = r["geometry"] == "a"
        want = {"lru": [50, 49], "arc": [50, 49]} if a else kept
        assert r["capacity"] == want, r
        fork_blocks = 10 if r["setting"] == "fork" else 1000 + (r["gpu"] or 0)
        assert r["footprint_blocks"] == (fork_blocks if a else 10**6), r
    assert out["command"] == "python -m bench.frontier; then cmd"


def test_the_footprint_counts_the_stores_of_the_workload_only():
    """A driver run's stored_chunks are pass 1's keys, the same stores its
    store_bytes count: the replays and probes that follow store keys of
    their own (undone) that must not enter the capacity footprint."""
    from bench import driver

    run = {"geometry": "gpt-oss-20b", "workload": "agentic",
           "variant": "default", "small": True, "retention": 0,
           "offload_retention": None, "tree": "fork"}  # fmt: skip
    result = driver.run(run, quick=True)
    assert result["probe_hits"], "the run must probe"
    per_chunk = [g["bytes_per_chunk"] for g in result["groups"]]
    stored = result["stored_chunks"]
    assert sum(n * per_chunk[g] for g, n in stored.items()) == result["store_bytes"]
