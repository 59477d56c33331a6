# SPDX-License-Identifier: Apache-2.0
"""`vllm serve` smoke: the OpenAI-compatible server on 127.0.0.1 with the tiny
Gemma-3 hybrid and the OffloadingConnector configured by --kv-transfer-config
JSON (the host-copy spec found through PYTHONPATH), engine core in its own
process as users run it.

The server runs with VLLM_PREFIX_CACHE_RETENTION_INTERVAL=512 and no
--prefix-cache-retention-interval flag: the series makes the engine use it.

The offload hit is compared with a GPU prefix-cache hit of the same prompt:
both reuse the same tokens and compute the same rest, so they agree to
rounding on any CPU. The fully computed first completion is not compared
(another prefill shape, other rounding)."""

import pytest
import requests

from e2e.engine_utils import (
    LOAD_BYTES,
    LOGPROB_ATOL,
    SKIPPED_BYTES,
    STORE_BYTES,
    predicted_store,
    prompt,
)
from e2e.serve_utils import (
    cached_tokens,
    complete,
    EXIT_TIMEOUT,
    free_port,
    group_kernel_libraries,
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

ENV_INTERVAL = 512
PROMPT = prompt(1100, seed=1)
HIT = (len(PROMPT) - 1) // BLOCK_SIZE * BLOCK_SIZE


def test_bad_interval_stops_serve_cleanly(gemma_hybrid, tmp_path):
    """--prefix-cache-retention-interval 48 (not a multiple of the 32-token
    chunk): the server exits non-zero with the series' message and leaves no
    process behind (API server, engine core, workers)."""
    port = free_port()
    rc, left, out = run_until_exit(
        serve_command(
            gemma_hybrid.path, port, "--prefix-cache-retention-interval", "48"
        ),
        serve_env(),
        tmp_path / "serve-bad.log",
    )
    assert rc not in (None, 0), f"rc={rc}:\n{out[-4000:]}"
    assert "--prefix-cache-retention-interval (48) must be a multiple" in out, out[
        -4000:
    ]
    assert not left, f"left running after the server exited: {left}"
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/health", timeout=2)


@pytest.fixture(scope="module")
def served(gemma_hybrid, tmp_path_factory):
    """Start the server, send the prompt (computed, stored), send it again
    (GPU prefix-cache hit), reset the GPU prefix cache (dev endpoint), send it
    a third time (offload hit), scrape /metrics; stop the server (process
    group) whatever happens."""
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = serve_env(
        VLLM_SERVER_DEV_MODE="1",
        VLLM_PREFIX_CACHE_RETENTION_INTERVAL=str(ENV_INTERVAL),
    )
    proc = start_server(serve_command(gemma_hybrid.path, port), env, log_path)
    try:
        wait_healthy(proc, base, log_path)

        first = complete(base, PROMPT)
        gpu_hit = complete(base, PROMPT)
        reset = requests.post(f"{base}/reset_prefix_cache", timeout=30)
        offload_hit = complete(base, PROMPT)
        metrics_text = requests.get(f"{base}/metrics", timeout=30).text
        yield {
            "first": first,
            "gpu_hit": gpu_hit,
            "reset_status": reset.status_code,
            "offload_hit": offload_hit,
            "metrics": metrics_text,
            "kernels": group_kernel_libraries(proc.pid),
            "log": read_log(log_path),
        }
    finally:
        left = stop_group(proc)
        assert not left, f"still running {EXIT_TIMEOUT} s after SIGTERM: {left}"


def engine_interval(labels) -> int | None:
    (info,) = labels["vllm:cache_config_info"]
    value = info["prefix_cache_retention_interval"]
    return None if value == "None" else int(value)


def token_logprobs(completion: dict) -> list[float]:
    return completion["choices"][0]["logprobs"]["token_logprobs"]


def test_offload_hit_is_cached_and_identical(served, record_property):
    first, gpu, offload = served["first"], served["gpu_hit"], served["offload_hit"]
    assert served["reset_status"] == 200
    assert first["usage"]["prompt_tokens"] == len(PROMPT)
    assert cached_tokens(first) == 0
    assert len(first["choices"][0]["token_ids"]) == 12
    # Same prefix reused, from the GPU prefix cache, then (after the reset
    # emptied it) from the offload tier.
    assert cached_tokens(gpu) == cached_tokens(offload) == HIT
    tokens = [c["choices"][0]["token_ids"] for c in (gpu, offload)]
    assert len(tokens[0]) == 12
    assert tokens[0] == tokens[1]
    assert gpu["choices"][0]["text"] == offload["choices"][0]["text"]
    pairs = zip(token_logprobs(gpu), token_logprobs(offload), strict=True)
    gap = max(abs(a - b) for a, b in pairs)
    record_property("max_logprob_gap", gap)
    # For the record only: another shape, so another rounding.
    record_property(
        "max_logprob_gap_vs_first",
        max(abs(a - b) for a, b in zip(token_logprobs(first), token_logprobs(offload))),
    )
    assert gap <= LOGPROB_ATOL, gap


def test_server_runs_the_kernels_this_process_runs(served, cpu_isa, record_property):
    """The engine core picks its vLLM kernel library as the in-process
    engines do (with tests/e2e/isa_avx2 on PYTHONPATH: the capped one)."""
    record_property("server_vllm_kernels", served["kernels"])
    assert ",".join(served["kernels"]) == cpu_isa["vllm_kernels"]


def test_metrics_show_offload_store_and_load(served, gemma_hybrid):
    values, labels = samples(served["metrics"])
    interval = engine_interval(labels)
    stored, _ = predicted_store_for(gemma_hybrid, interval)
    assert values[f"{STORE_BYTES}_total"] == stored
    # The hit: every full-attention block, the sliding window's last block.
    page = gemma_hybrid.attn_page_bytes()
    assert values[f"{LOAD_BYTES}_total"] == (HIT // BLOCK_SIZE * 2 + 2) * page
    assert values["vllm:external_prefix_cache_hits_total"] == HIT


def predicted_store_for(model, interval):
    return predicted_store(model, [PROMPT], interval, BLOCK_SIZE)


def test_metrics_show_skipped_bytes(served, gemma_hybrid):
    """Series metrics patch: the bytes retention kept out of the store."""
    values, labels = samples(served["metrics"])
    name = f"{SKIPPED_BYTES}_total"
    assert name in values, sorted(k for k in values if "offload" in k)
    dense, _ = predicted_store_for(gemma_hybrid, None)
    assert values[name] == dense - values[f"{STORE_BYTES}_total"]
    assert values[name] > 0


def test_env_interval_used_when_flag_absent(served, gemma_hybrid):
    """Series env-var patch: `vllm serve` honours the deprecated env var when
    --prefix-cache-retention-interval is absent (0.29.0 runs with 0)."""
    values, labels = samples(served["metrics"])
    assert engine_interval(labels) == ENV_INTERVAL
    stored, _ = predicted_store_for(gemma_hybrid, ENV_INTERVAL)
    assert values[f"{STORE_BYTES}_total"] == stored
    assert (
        "VLLM_PREFIX_CACHE_RETENTION_INTERVAL" in served["log"]
    )  # deprecation warning
