# SPDX-License-Identifier: Apache-2.0
"""`vllm serve` with the offload tier's own retention interval: the GPU prefix
cache at 0 (--prefix-cache-retention-interval 0), the OffloadingConnector at
None ("retention_interval": null in its kv_connector_extra_config), the tiny
Gemma-3 hybrid (full attention + a 32-token sliding window), engine core in
its own process.

Prompt A is computed and stored. Request B shares A's first S tokens (S on a
chunk edge, no boundary the GPU cache keeps at 0): the GPU cache holds no
sliding-window tail there, the dense offload tier does, so B's S cached
tokens come from the offload tier. B again then hits the GPU cache at its
replay boundary, S: the same shape (S tokens reused, the rest computed), so
the two completions agree to rounding on any CPU."""

import pytest
import requests

from e2e.engine_utils import (
    LOGPROB_ATOL,
    SKIPPED_BYTES,
    STORE_BYTES,
    kv_transfer_config,
    predicted_store,
    prompt,
)
from e2e.serve_utils import (
    cached_tokens,
    complete,
    EXIT_TIMEOUT,
    free_port,
    read_log,
    run_until_exit,
    samples,
    serve_command,
    serve_env,
    start_server,
    stop_group,
    wait_healthy,
)
from e2e.tiny_models import BLOCK_SIZE

PROMPT = prompt(1100, seed=5)
SHARED = 20 * BLOCK_SIZE  # a chunk edge the GPU cache at 0 keeps no tail at
SHARING = PROMPT[: SHARED + 1]  # its replay boundary is SHARED
INFO = "vllm:kv_offload_retention_interval_info"


@pytest.fixture(scope="module")
def served(gemma_hybrid, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("serve-tier") / "serve.log"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = serve_command(
        gemma_hybrid.path,
        port,
        "--prefix-cache-retention-interval",
        "0",
        kv_transfer=kv_transfer_config(retention_interval=None),
    )
    proc = start_server(command, serve_env(), log_path)
    try:
        wait_healthy(proc, base, log_path)
        first = complete(base, PROMPT)
        offload_hit = complete(base, SHARING)
        gpu_hit = complete(base, SHARING)
        metrics_text = requests.get(f"{base}/metrics", timeout=30).text
        yield {
            "first": first,
            "offload_hit": offload_hit,
            "gpu_hit": gpu_hit,
            "metrics": metrics_text,
            "log": read_log(log_path),
        }
    finally:
        left = stop_group(proc)
        assert not left, f"still running {EXIT_TIMEOUT} s after SIGTERM: {left}"


def test_offload_tier_stores_densely_beside_a_sparse_gpu_cache(served, gemma_hybrid):
    values, labels = samples(served["metrics"])
    (info,) = labels[INFO]
    assert (info["gpu"], info["offload"]) == ("0", "None")
    assert values[INFO] == 1
    # Every chunk of A: the GPU cache's interval (0) would store less.
    dense, _ = predicted_store(gemma_hybrid, [PROMPT], None, BLOCK_SIZE)
    sparse, _ = predicted_store(gemma_hybrid, [PROMPT], 0, BLOCK_SIZE)
    assert sparse < dense
    assert values[f"{STORE_BYTES}_total"] == dense
    assert values.get(f"{SKIPPED_BYTES}_total", 0) == 0
    assert (
        "prefix-cache retention interval 0 in the GPU prefix cache, None in "
        "the offload tier" in served["log"]
    )


def test_offload_hit_where_the_gpu_cache_has_none(served):
    first, offload, gpu = served["first"], served["offload_hit"], served["gpu_hit"]
    assert cached_tokens(first) == 0
    assert cached_tokens(offload) == cached_tokens(gpu) == SHARED
    values, _ = samples(served["metrics"])
    # B's cached tokens came from the offload tier, B again's from the GPU.
    assert values["vllm:external_prefix_cache_hits_total"] == SHARED
    tokens = [c["choices"][0]["token_ids"] for c in (offload, gpu)]
    assert len(tokens[0]) == 12
    assert tokens[0] == tokens[1]
    pairs = zip(
        offload["choices"][0]["logprobs"]["token_logprobs"],
        gpu["choices"][0]["logprobs"]["token_logprobs"],
        strict=True,
    )
    gap = max(abs(a - b) for a, b in pairs)
    assert gap <= LOGPROB_ATOL, gap


def test_bad_offload_interval_stops_serve_with_one_line(gemma_hybrid, tmp_path):
    """An offload interval that is not a multiple of the 32-token chunk: the
    server exits non-zero naming the key and the value."""
    rc, left, out = run_until_exit(
        serve_command(
            gemma_hybrid.path,
            free_port(),
            kv_transfer=kv_transfer_config(retention_interval=48),
        ),
        serve_env(),
        tmp_path / "serve-bad.log",
    )
    assert rc not in (None, 0), f"rc={rc}:\n{out[-4000:]}"
    assert (
        'kv_connector_extra_config["retention_interval"] (48) must be a multiple' in out
    ), out[-4000:]
    assert not left, f"left running after the server exited: {left}"
