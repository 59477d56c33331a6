# SPDX-License-Identifier: Apache-2.0
"""KV-cache geometries of four published models, built the way vLLM 0.29.0
builds them: each layer's ``KVCacheSpec`` is what the model's attention layer
returns from ``get_kv_cache_spec`` (file named at each builder), and the caller
groups them with vLLM's own ``get_kv_cache_configs``.

Only the config.json values the specs read are written here, each with its
source. No weights, no hub access."""

import math
from dataclasses import dataclass, field

import torch

# --- Published config.json values -------------------------------------------

# huggingface.co/deepseek-ai/DeepSeek-V4-Flash/blob/main/config.json
# (43 layers; compress_ratios has one more entry, for the MTP layer, which
# only runs with speculative decoding and is left out here).
DEEPSEEK_V4_FLASH = {
    "num_hidden_layers": 43,
    "head_dim": 512,
    "qk_rope_head_dim": 64,
    "index_head_dim": 128,
    "sliding_window": 128,
    "compress_ratios": [0, 0] + [4, 128] * 20 + [4, 0],
    "quantization_config": {"quant_method": "fp8"},
}

# huggingface.co/openai/gpt-oss-20b/blob/main/config.json
GPT_OSS_20B = {
    "num_hidden_layers": 24,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "torch_dtype": "bfloat16",
}

# huggingface.co/google/gemma-3-12b-it/blob/main/config.json (text_config):
# every 6th layer is global (sliding_window_pattern 6), the rest local.
GEMMA_3_12B = {
    "num_hidden_layers": 48,
    "num_key_value_heads": 8,
    "head_dim": 256,
    "sliding_window": 1024,
    "sliding_window_pattern": 6,
    "torch_dtype": "bfloat16",
}

# huggingface.co/ibm-granite/granite-4.0-h-1b/blob/main/config.json
GRANITE_4_0_H_1B = {
    "hidden_size": 1536,
    "num_hidden_layers": 40,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "layer_types": (
        ["mamba"] * 5
        + ["attention"]
        + (["mamba"] * 9 + ["attention"]) * 3
        + ["mamba"] * 4
    ),
    "mamba_n_heads": 48,
    "mamba_d_head": 64,
    "mamba_n_groups": 1,
    "mamba_d_state": 128,
    "mamba_d_conv": 4,
    "mamba_chunk_size": 256,
    "torch_dtype": "bfloat16",
}


@dataclass
class Geometry:
    name: str
    source: str
    # CacheConfig settings the engine ends up with for this model.
    block_size: int
    cache_dtype: str = "auto"
    # Layout the engine core resolves (vllm/v1/attention/backends/utils.py).
    kv_cache_layout: str = "LBNHC"
    mamba_cache_mode: str = "none"
    mamba_block_size: int | None = None
    notes: list[str] = field(default_factory=list)
    specs: dict = field(default_factory=dict)


def deepseek_v4_flash() -> Geometry:
    """vllm/models/deepseek_v4/attention.py (DeepseekV4Attention,
    DeepseekV4IndexerCache), compressor.py (CompressorStateCache) and
    vllm/v1/attention/backends/mla/sparse_swa.py (DeepseekV4SWACache), with
    ``--kv-cache-dtype fp8`` resolved to ``fp8_ds_mla`` (uint8 pages, 584 B
    per token, 576 B alignment) and ``--block-size 256``."""
    from vllm.v1.kv_cache_interface import MLAAttentionSpec, SlidingWindowMLASpec

    c = DEEPSEEK_V4_FLASH
    fp8 = dict(cache_dtype_str="fp8_ds_mla", alignment=576)
    specs = {}
    for i in range(c["num_hidden_layers"]):
        ratio = max(1, c["compress_ratios"][i])
        p = f"model.layers.{i}.attn"
        # Every layer: the raw sliding window, 64-token blocks.
        specs[f"{p}.swa_cache"] = SlidingWindowMLASpec(
            block_size=64, num_kv_heads=1, head_size=c["head_dim"],
            dtype=torch.uint8, sliding_window=c["sliding_window"],
            state_content_bytes=584, model_version="deepseek_v4", **fp8,
        )  # fmt: skip
        if ratio == 1:
            continue
        # Compressed MLA rows, one per `ratio` tokens (full attention).
        specs[p] = MLAAttentionSpec(
            block_size=256, num_kv_heads=1, head_size=c["head_dim"],
            dtype=torch.uint8, tokens_per_state=ratio,
            model_version="deepseek_v4", state_content_bytes=584, **fp8,
        )  # fmt: skip
        # The compressor's float32 state: window coff * ratio, 4- or 8-token
        # blocks (coff = 2 for the overlapping ratio-4 compressor).
        coff = 1 + (ratio == 4)
        specs[f"{p}.compressor.state_cache"] = SlidingWindowMLASpec(
            block_size=4 if ratio == 4 else 8, num_kv_heads=1,
            head_size=2 * coff * c["head_dim"], dtype=torch.float32,
            sliding_window=coff * ratio, alignment=576,
        )  # fmt: skip
        if ratio == 4:
            # Ratio-4 layers also have the sparse indexer: its fp8 key cache
            # (128 B + 4 B scale per row) and its own compressor state.
            d = c["index_head_dim"]
            specs[f"{p}.indexer.k_cache"] = MLAAttentionSpec(
                block_size=256, num_kv_heads=1, head_size=d + d // 128 * 4,
                dtype=torch.uint8, tokens_per_state=4, alignment=576,
            )  # fmt: skip
            specs[f"{p}.indexer.compressor.state_cache"] = SlidingWindowMLASpec(
                block_size=4, num_kv_heads=1, head_size=2 * 2 * d,
                dtype=torch.float32, sliding_window=8, alignment=576,
            )  # fmt: skip
    return Geometry(
        name="deepseek-v4-flash",
        source="deepseek-ai/DeepSeek-V4-Flash config.json; vLLM 0.29.0 DeepSeek-V4 "
        "layer specs, --kv-cache-dtype fp8 --block-size 256",
        block_size=256,
        cache_dtype="fp8",
        # The DeepSeek-V4 indexer backend only supports block-outermost
        # layouts (vllm/v1/attention/backends/mla/indexer.py), which makes
        # vLLM pack the mixed page sizes (_get_packed_kv_cache_groups).
        kv_cache_layout="BLHNC",
        specs=specs,
        notes=["MTP layer omitted (no speculative decoding)"],
    )


def gpt_oss_20b() -> Geometry:
    """vllm/model_executor/models/gpt_oss.py: Attention layers with
    per_layer_sliding_window on the sliding layers; bf16 KV, block 16."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    c = GPT_OSS_20B
    kv = dict(num_kv_heads=c["num_key_value_heads"], head_size=c["head_dim"],
              dtype=torch.bfloat16)  # fmt: skip
    specs = {}
    for i, kind in enumerate(c["layer_types"]):
        name = f"model.layers.{i}.attn.attn"
        if kind == "sliding_attention":
            specs[name] = SlidingWindowSpec(
                block_size=16, sliding_window=c["sliding_window"], **kv
            )
        else:
            specs[name] = FullAttentionSpec(block_size=16, **kv)
    return Geometry(
        name="gpt-oss-20b",
        source="openai/gpt-oss-20b config.json; bf16 KV, block 16",
        block_size=16,
        specs=specs,
    )


def gemma_3_12b() -> Geometry:
    """vllm/model_executor/models/gemma3.py: 5 local (window 1024) : 1 global
    layers; bf16 KV, block 16."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    c = GEMMA_3_12B
    kv = dict(num_kv_heads=c["num_key_value_heads"], head_size=c["head_dim"],
              dtype=torch.bfloat16)  # fmt: skip
    specs = {}
    for i in range(c["num_hidden_layers"]):
        name = f"model.layers.{i}.self_attn.attn"
        if (i + 1) % c["sliding_window_pattern"]:
            specs[name] = SlidingWindowSpec(
                block_size=16, sliding_window=c["sliding_window"], **kv
            )
        else:
            specs[name] = FullAttentionSpec(block_size=16, **kv)
    return Geometry(
        name="gemma-3-12b",
        source="google/gemma-3-12b-it config.json (text); bf16 KV, block 16",
        block_size=16,
        specs=specs,
        notes=[
            "sub-block alignment fallback not triggered: the global layers' "
            "16-token chunks are a multiple of the local layers' 16-token blocks"
        ],
    )


def granite_4_0_h_1b() -> Geometry:
    """vllm/model_executor/models/granitemoehybrid.py: Mamba2 layers
    (MambaMixer2, MambaSpec from layers/mamba/abstract.py) and full attention;
    --mamba-cache-mode all. The attention block size is set so one attention
    page holds one Mamba state, as Platform._align_hybrid_block_size does
    (vllm/platforms/interface.py) with FlashAttention's 16-token kernel blocks;
    the Mamba page is padded to the attention page."""
    from vllm.model_executor.layers.mamba.mamba_utils import (
        MambaStateShapeCalculator,
    )
    from vllm.utils.math_utils import cdiv
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    c = GRANITE_4_0_H_1B
    dtype = torch.bfloat16
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    attn = FullAttentionSpec(
        block_size=1, num_kv_heads=c["num_key_value_heads"], head_size=head_dim,
        dtype=dtype,
    )  # fmt: skip
    shapes = MambaStateShapeCalculator.mamba2_state_shape(
        tp_world_size=1,
        intermediate_size=c["mamba_n_heads"] * c["mamba_d_head"],
        n_groups=c["mamba_n_groups"],
        num_heads=c["mamba_n_heads"],
        head_dim=c["mamba_d_head"],
        state_size=c["mamba_d_state"],
        conv_kernel=c["mamba_d_conv"],
    )
    # mamba_ssm_cache_dtype "auto": both states in the model dtype.
    mamba_page = MambaSpec(shapes=shapes, dtypes=(dtype, dtype), block_size=-1)
    # lcm(mamba chunk, FlashAttention's 16-token kernel block alignment)
    chunk = math.lcm(c["mamba_chunk_size"], 16)
    block = chunk * cdiv(cdiv(mamba_page.page_size_bytes, attn.page_size_bytes), chunk)
    mode = mamba_prefix_cache_mode()
    specs = {}
    for i, kind in enumerate(c["layer_types"]):
        if kind == "attention":
            specs[f"model.layers.{i}.self_attn.attn"] = FullAttentionSpec(
                block_size=block, num_kv_heads=c["num_key_value_heads"],
                head_size=head_dim, dtype=dtype,
            )  # fmt: skip
        else:
            specs[f"model.layers.{i}.mamba"] = MambaSpec(
                shapes=shapes, dtypes=(dtype, dtype), block_size=block,
                page_size_padded=block * attn.page_size_bytes,
                mamba_cache_mode=mode,
            )  # fmt: skip
    return Geometry(
        name="granite-4.0-h-1b",
        source=f"ibm-granite/granite-4.0-h-1b config.json; bf16, --mamba-cache-mode {mode}",
        block_size=block,
        mamba_cache_mode=mode,
        mamba_block_size=block,
        specs=specs,
    )


def mamba_prefix_cache_mode() -> str:
    """--mamba-cache-mode all (every block-aligned state) where the base has
    it (0.29.0); 0.32.0 and later keep align only."""
    from typing import get_args

    from vllm.config.cache import MambaCacheMode

    return "all" if "all" in get_args(MambaCacheMode) else "align"


BUILDERS = {
    "deepseek-v4-flash": deepseek_v4_flash,
    "gpt-oss-20b": gpt_oss_20b,
    "gemma-3-12b": gemma_3_12b,
    "granite-4.0-h-1b": granite_4_0_h_1b,
}
