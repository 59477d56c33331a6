# SPDX-License-Identifier: Apache-2.0
"""The soak's output assertion (bench/soak.py check()) on made-up runs: an
fp32 divergence past a near tie always fails; a bf16 run fails only when
more than its allowed share of completed requests part from the reference."""

from dataclasses import asdict

import pytest

from bench.soak import BF16_DIVERGENCE_SHARE, TIE_MARGIN, Record, RunSpec, check

COMPLETED = 20
MAX_TOKENS = 4


def reference(margin: float) -> dict[int, Record]:
    return {
        i: Record(
            kind="few_shot",
            prompt_id=i,
            max_tokens=MAX_TOKENS,
            status=200,
            tokens=[10, 11, 12, 13],
            logprobs=[-0.5] * MAX_TOKENS,
            margins=[margin] * MAX_TOKENS,
        )
        for i in range(COMPLETED)
    }


def run(model: str, diverging: int) -> dict:
    """A healthy run of COMPLETED requests, `diverging` of which part from
    the reference at their second token."""
    records = []
    for i in range(COMPLETED):
        tokens = [10, 99, 98, 97] if i < diverging else [10, 11, 12, 13]
        records.append(
            Record(
                kind="few_shot",
                prompt_id=i,
                max_tokens=MAX_TOKENS,
                status=200,
                tokens=tokens,
                logprobs=[-0.5] * MAX_TOKENS,
            )
        )
    audit_keys = (
        "pending_store_keys",
        "manager_write_pending_blocks",
        "pending_load_keys",
        "stored_not_loadable",
        "leaked_host_blocks",
    )
    return {
        "spec": asdict(RunSpec(model, 0, "lru", 1)),
        "records": [asdict(r) for r in records],
        "alive_after_load": True,
        "drained": True,
        "metrics": {
            "vllm:external_prefix_cache_hits_total": 1,
            "vllm:num_preemptions_total": 1,
        },
        "audit": {
            **dict.fromkeys(audit_keys, 0),
            "counts": {"keys_evicted": 1},
            "evictable_blocks": 3,
            "stored_keys": 3,
        },
        "shutdown": {"exit_s": 0.5, "clients_hanging": 0},
        "log_tracebacks": 0,
        "memory": {},
    }


def divergence_fails(model: str, diverging: int, margin: float) -> list[str]:
    res = run(model, diverging)
    fails = check([res], {model: reference(margin)}, quick=True)
    return [f for f in fails if "reference" in f]


def test_a_healthy_run_passes():
    for model in ("gemma", "granite"):
        assert check([run(model, 0)], {model: reference(1.0)}, quick=True) == []


@pytest.mark.parametrize("model", ["gemma", "granite"])
def test_a_near_tie_divergence_is_allowed(model):
    assert divergence_fails(model, COMPLETED, TIE_MARGIN[model] / 2) == []


def test_fp32_fails_on_one_divergence_past_a_tie():
    fails = divergence_fails("gemma", 1, 1.0)
    assert fails == [
        "gemma-0-lru: prompt 0: token 1 differs from the reference "
        f"(its margin 1 > {TIE_MARGIN['gemma']})"
    ]


def test_bf16_fails_only_past_its_share():
    allowed = int(BF16_DIVERGENCE_SHARE["granite"] * COMPLETED)
    assert divergence_fails("granite", allowed, 1.0) == []
    fails = divergence_fails("granite", allowed + 1, 1.0)
    assert fails[0] == (
        f"granite-0-lru: {allowed + 1} of {COMPLETED} completed requests part "
        "from the reference past a near tie (more than 15%)"
    )
    # Then each of them, so the report shows where they parted.
    assert len(fails) == 1 + allowed + 1
