# SPDX-License-Identifier: Apache-2.0
"""Offload capacity, one vLLM tree: the workload through the real scheduler
and OffloadingConnector with vLLM's own ``CPUOffloadingSpec`` (LRU or ARC, a
``cpu_bytes_to_use`` budget, exactly as ``vllm serve --kv-offloading-size``
configures it) instead of the unlimited recorder.

The real spec builds here: its ``__init__`` and ``get_manager()`` need no
accelerator (only ``get_worker`` does, and the benchmark has no worker), so
block sizing (``worker_kv_bytes_per_block`` x ``blocks_per_chunk`` rounded to
the shared-region alignment, one CPU block per offload key whatever its
group) and eviction are vLLM's own.

Hit measure: what the tier is worth once the GPU prefix cache no longer holds
the workload. Pass 1 runs the workload as ``bench.driver.run`` does (rounds
submitted together, large GPU cache), so in-pass hits come from the GPU cache
and the tier only fills and evicts; pass 2 replays every prompt with the GPU
prefix cache reset against the tier as pass 1 left it (restored after each
replay, so replays neither evict nor refresh one another) and sums the
external hit tokens. With an unlimited budget this is the store benchmark's
replay hit count, which the recorder run checks.

    python -m bench.capacity_driver CONFIG.json OUT.jsonl   (one JSON line per run)

CONFIG: {"runs": [{"geometry", "workload", "retention", "stock", "small",
"mode": "recorder" | "sweep", "budgets": [blocks], "policies": [...]}]}. A
budget run's spec may carry "offload_retention", the connector's own interval
(as in ``bench.driver``; absent: the GPU prefix cache's).
"""

import dataclasses
import json
import math
import sys
import time
from pathlib import Path

from bench.driver import (
    Sim,
    checked_offload_retention,
    log,
    offload_extra_config,
    workload,
)

# Relative budget precision of the 90% bisection.
BISECT_PRECISION = 1.2
KEEP = 0.9


def gpu_retention(spec: dict):
    """Stock's connector ignores the interval, but its GPU prefix cache must
    run with the same one as the fork it is compared with."""
    return spec["gpu_retention"] if spec["stock"] else spec["retention"]


def cpu_block_bytes(sim: Sim) -> int:
    """Bytes of one CPU block as ``CPUOffloadingSpec`` sizes it."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
        build_offloading_config,
    )
    from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

    config = build_offloading_config(sim.vllm_config, sim.scheduler.kv_cache_config)
    extra = {**config.extra_config, "cpu_bytes_to_use": 1}
    return CPUOffloadingSpec(
        dataclasses.replace(config, extra_config=extra)
    ).kv_bytes_per_chunk


def manager_blocks(manager, name: str) -> int:
    """The CPU manager's ``<name>_blocks`` counter (0.32.0 renamed its blocks
    to chunks: ``<name>_chunks``)."""
    value = getattr(manager, f"{name}_blocks", None)
    return getattr(manager, f"{name}_chunks") if value is None else value


def pass1(sim: Sim, rounds) -> None:
    for round_ in rounds:
        for prompt, output in round_:
            sim.add(prompt, output)
        sim.drain()


def replay_hits(sim: Sim, prompts) -> int:
    """Sum of cold-GPU external hits against pass 1's tier, frozen: replays
    store nothing and refresh nothing, so none changes what another finds
    (loads only pin and unpin blocks; nothing is evicted meanwhile)."""
    from vllm.v1.kv_offload.base import PrepareStoreOutput

    manager = sim.manager
    empty = manager._get_load_store_spec([], [])
    manager.prepare_store = lambda keys, ctx: PrepareStoreOutput([], empty, [])
    manager.touch = lambda keys, ctx: None
    total = 0
    for prompt in prompts:
        assert sim.scheduler.reset_prefix_cache()
        req_id = sim.add(prompt, [1])
        sim.drain()
        total += sim.first_hit.get(req_id, 0)
    return total


def recorder_run(spec: dict, rounds) -> dict:
    """Unlimited recorder: the reference hits and the footprint in keys."""
    sim = Sim(spec["geometry"], gpu_retention(spec))
    pass1(sim, rounds)
    keys = len(sim.manager.stored)
    hits = sum(sim.replay_hit(p) for r in rounds for p, _ in r)
    return {"footprint_blocks": keys, "hits": hits, "block_bytes": cpu_block_bytes(sim)}


class Counting:
    """Counts what the manager stores and evicts (transfer and churn)."""

    def __init__(self, manager):
        self.stored = self.evicted = self.refused = self.peak = 0
        prepare = manager.prepare_store

        def prepare_store(keys, req_context):
            out = prepare(keys, req_context)
            if out is None:
                self.refused += 1
                return out
            self.stored += len(out.keys_to_store)
            self.evicted += len(out.evicted_keys)
            used = manager_blocks(manager, "_num_allocated") - len(manager._free_list)
            self.peak = max(self.peak, used)
            return out

        manager.prepare_store = prepare_store


def budget_run(spec: dict, rounds, blocks: int | None, policy: str) -> dict:
    """One budget point; ``blocks`` None is an unlimited budget."""
    block_bytes = spec["block_bytes"]
    budget = (1 << 60) if blocks is None else blocks * block_bytes
    sim = Sim(
        spec["geometry"],
        gpu_retention(spec),
        connector_config={
            "cpu_bytes_to_use": budget,
            "eviction_policy": policy,
            **offload_extra_config(spec),
        },
    )
    checked_offload_retention(sim, spec, gpu_retention(spec))
    assert blocks is None or manager_blocks(sim.manager, "_num") == blocks
    counts = Counting(sim.manager)
    pass1(sim, rounds)
    hits = replay_hits(sim, [p for r in rounds for p, _ in r])
    return {
        "policy": policy,
        "budget_blocks": blocks,
        "budget_bytes": None if blocks is None else budget,
        "hits": hits,
        "stored_blocks": counts.stored,
        "stored_bytes": counts.stored * block_bytes,
        "evicted_blocks": counts.evicted,
        "refused_stores": counts.refused,
        "peak_blocks": counts.peak,
    }


def point(spec: dict, rounds, blocks: int, policy: str, full: dict) -> dict:
    """A budget that holds every block the unlimited run stored never evicts
    or refuses a store, so that run is the unlimited one: copied, not rerun."""
    if blocks < full["stored_blocks"]:
        return budget_run(spec, rounds, blocks, policy)
    budget = blocks * spec["block_bytes"]
    return {**full, "budget_blocks": blocks, "budget_bytes": budget, "copied": True}


def sweep(spec: dict, rounds, policy: str) -> list[dict]:
    """The unlimited point, then the grid."""
    full = budget_run(spec, rounds, None, policy)
    return [full, *(point(spec, rounds, b, policy, full) for b in spec["budgets"])]


def bisect_keep(spec: dict, rounds, policy: str, points: list[dict]) -> dict | None:
    """Smallest budget (to BISECT_PRECISION) whose hits keep KEEP of the
    unlimited hits, between the sweep points that bracket it."""
    full = next(p for p in points if p["budget_blocks"] is None)
    if not full["hits"]:
        return None
    goal = math.ceil(KEEP * full["hits"])
    finite = sorted(
        (p for p in points if p["budget_blocks"] is not None),
        key=lambda p: p["budget_blocks"],
    )
    ok = [p for p in finite if p["hits"] >= goal]
    if not ok:
        return None
    hi = ok[0]["budget_blocks"]
    below = [p["budget_blocks"] for p in finite if p["budget_blocks"] < hi]
    lo = below[-1] if below else 0
    while hi > lo + 1 and hi > lo * BISECT_PRECISION:
        mid = (lo + hi) // 2 if lo == 0 else max(lo + 1, int(math.sqrt(lo * hi)))
        points.append(point(spec, rounds, mid, policy, full))
        if points[-1]["hits"] >= goal:
            hi = mid
        else:
            lo = mid
    return {"goal_hits": goal, "blocks": hi, "bytes": hi * spec["block_bytes"]}


def run(spec: dict) -> dict:
    t0 = time.time()
    rounds = workload(spec["workload"], spec["small"])
    who = "stock" if spec["stock"] else f"fork {spec['retention']}"
    tag = f"{spec['geometry']} {spec['workload']} {who}"
    if spec["mode"] == "recorder":
        out = {**spec, **recorder_run(spec, rounds)}
    else:
        out = {**spec, "points": {}, "keep90": {}}
        for policy in spec["policies"]:
            points = sweep(spec, rounds, policy)
            out["keep90"][policy] = bisect_keep(spec, rounds, policy, points)
            out["points"][policy] = sorted(
                points, key=lambda p: math.inf if p["budget_blocks"] is None
                else p["budget_blocks"],
            )  # fmt: skip
    import vllm

    out["vllm_file"] = vllm.__file__
    out["seconds"] = round(time.time() - t0, 1)
    log(f"capacity {spec['mode']} {tag}: {out['seconds']} s")
    return out


def main() -> None:
    config = json.loads(Path(sys.argv[1]).read_text())
    with open(sys.argv[2], "a") as out:
        for spec in config["runs"]:
            out.write(json.dumps(run(spec)) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
