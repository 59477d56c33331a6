# SPDX-License-Identifier: Apache-2.0
"""GPU job (ci/gpu_tests.sh): the fork's CUDA wheel runs vLLM's own
CPUOffloadingSpec (the OffloadingConnector's default spec, which refuses the
CPU platform) on a tiny Gemma-3 hybrid (sliding window + full attention):
pass 1 computes and stores, the GPU prefix cache is reset, pass 2 reuses the
prefix from the offload tier with the same greedy tokens. At the default
interval 0 the sliding-window group is stored sparsely: skipped bytes > 0.
Needs tests/ on PYTHONPATH (tiny model and prompt helpers of tests/e2e)."""

import pytest
import torch

from e2e.engine_utils import (
    SKIPPED_BYTES,
    STORE_BYTES,
    engine_kwargs,
    metrics,
    prompt,
    running_engine,
)
from e2e.tiny_models import BLOCK_SIZE, gemma3_hybrid

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_cpu_offloading_spec_reload(tmp_path):
    from vllm import SamplingParams, TokensPrompt

    import vllm

    assert "+fork." in vllm.__version__
    model = gemma3_hybrid(tmp_path)
    kwargs = engine_kwargs(model, connector=False)
    kwargs["kv_transfer_config"] = {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_bytes_to_use": 256 << 20},
    }
    tokens = prompt(1100, seed=1)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    with running_engine(**kwargs) as llm:
        first = llm.generate(TokensPrompt(prompt_token_ids=tokens), params)[0]
        stored = metrics(llm)
        llm.reset_prefix_cache()
        second = llm.generate(TokensPrompt(prompt_token_ids=tokens), params)[0]
        after = metrics(llm)
    hit = (len(tokens) - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert second.num_cached_tokens == hit
    assert after["vllm:external_prefix_cache_hits"] >= hit
    assert stored[STORE_BYTES] > 0
    assert stored.get(SKIPPED_BYTES, 0) > 0
    assert second.outputs[0].token_ids == first.outputs[0].token_ids
