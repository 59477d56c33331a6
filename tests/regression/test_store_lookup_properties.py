# SPDX-License-Identifier: Apache-2.0
"""Property search over random geometries: sparse stores against a reference
that stores every chunk, through the real OffloadingConnectorScheduler.

(a) no lost hits: every request that reuses a retained boundary (the replay,
    a request extending the prompt, each interval segment) gets the same
    external hit as with every chunk stored;
(b) no wasted stores: every stored sliding-window chunk is one of those
    lookups' hits (with decode offloading, at most one tail per group).

A segment boundary b counts as reused by a request sharing b tokens plus the
EAGLE peek (one chunk of the largest EAGLE group), as in the GPU prefix cache.
Mamba groups cannot run here (vLLM's RequestRunner registers attention KV
tensors only); the Mamba masks are covered by the series' unit tests."""

import os
from collections import Counter
from math import lcm

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from offload_sim import EVERY_CHUNK, OffloadSim, full, groups, swa

from tests.v1.kv_connector.unit.utils import EOS_TOKEN_ID
from vllm.v1.kv_offload.base import get_offload_group_idx as group_of


def prompt(n: int, seed: int = 0) -> list[int]:
    return [(seed * 7919 + i) % 997 + 3 for i in range(n)]


@st.composite
def cases(draw):
    blocks_per_chunk = draw(st.sampled_from([1, 1, 2]))
    with_full = draw(st.booleans()) or blocks_per_chunk > 1
    full_block = draw(st.sampled_from([8, 16]))
    sizes = [full_block] if blocks_per_chunk > 1 else [4, 8, 16]
    swa_specs = [
        (draw(st.sampled_from(sizes)), draw(st.integers(1, 48)))
        for _ in range(draw(st.integers(1, 2)))
    ]
    # (block_size, window or None for full attention), printed on failure
    layout = ([(full_block, None)] if with_full else []) + swa_specs
    eagle_mode = draw(st.sampled_from(["none", "none", "swa", "all"]))
    eagle = {
        "none": (),
        "swa": (len(layout) - 1,),
        "all": tuple(range(len(layout))),
    }[eagle_mode]
    chunks = [b * blocks_per_chunk for b, _ in layout]
    align = chunks[0] if with_full else lcm(*chunks)
    retention = draw(st.sampled_from([None, 0, 1, 2]))
    if retention:
        retention *= lcm(align, *chunks)
    return dict(
        layout=layout,
        eagle=eagle,
        blocks_per_chunk=blocks_per_chunk,
        align=align,
        peek=max((chunks[i] for i in eagle), default=0),
        retention=retention,
        num_prompt=draw(st.integers(16, 150)),
        offload_prompt_only=draw(st.booleans()),
    )


def reuse_requests(case) -> list[list[int]]:
    tokens = prompt(case["num_prompt"])
    stored = tokens if case["offload_prompt_only"] else tokens + [EOS_TOKEN_ID]
    requests = [tokens, tokens + prompt(40, seed=1)]
    segment = case["align"] if case["retention"] is None else case["retention"]
    if segment:
        for b in range(segment, len(stored) - case["peek"] + 1, segment):
            shared = stored[: b + case["peek"]]
            requests.append(shared + prompt(40, seed=2 + b))
    return requests


def simulate(case, retention):
    sim = OffloadSim(
        groups(
            *(full(b) if w is None else swa(b, w) for b, w in case["layout"]),
            eagle=case["eagle"],
        ),
        retention,
        case["offload_prompt_only"],
        case["blocks_per_chunk"],
    )
    sim.run(prompt(case["num_prompt"]))
    stored = set(sim.stored)
    hits = [sim.replay_hit(request) for request in reuse_requests(case)]
    return sim, stored, hits


@settings(
    max_examples=int(os.environ.get("FORK_PROPERTY_EXAMPLES", "60")),
    deadline=None,
    derandomize="FORK_PROPERTY_EXAMPLES" not in os.environ,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(cases())
def test_sparse_stores_match_every_chunk_stores(case):
    _, every_stored, every_hits = simulate(case, EVERY_CHUNK)
    sim, stored, hits = simulate(case, case["retention"])
    # (a) no lost hits at any retained boundary.
    assert hits == every_hits
    # (b) every stored sliding-window chunk served one of those lookups. With
    # decode tokens offloaded too (offload_prompt_only off) a store cannot
    # know where the request will stop: at most the tail of one segment the
    # request stopped short of may be stored per group.
    full_groups = {i for i, (_, w) in enumerate(case["layout"]) if w is None}
    unused = Counter(
        group_of(k)
        for k in stored - sim.looked_up_hits
        if group_of(k) not in full_groups
    )
    if case["offload_prompt_only"]:
        assert not unused, f"stored sliding-window chunks never hit: {unused}"
    else:
        for group, count in unused.items():
            block, window = case["layout"][group]
            tail = -(-window // (block * case["blocks_per_chunk"])) + 1
            assert count <= tail, f"group {group}: {count} unused chunks"
    # Sparse never stores more, and full attention is untouched.
    assert stored <= every_stored
    assert {k for k in stored if group_of(k) in full_groups} == {
        k for k in every_stored if group_of(k) in full_groups
    }
