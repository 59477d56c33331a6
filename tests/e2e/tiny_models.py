# SPDX-License-Identifier: Apache-2.0
"""Tiny random-weight models written on the fly (seeded, ~0.2 s each).

The hub is unreachable here: each builder writes a transformers checkpoint
(config + safetensors, float32) plus a word-level tokenizer into a directory,
so both ``vllm.LLM`` (token-id prompts) and ``vllm serve`` can load it."""

from dataclasses import dataclass
from pathlib import Path

import torch

VOCAB_SIZE = 512
BLOCK_SIZE = 32  # CPU attention wants multiples of 32
WINDOW = 32
NUM_KV_HEADS = 1
HEAD_DIM = 64
DTYPE_BYTES = 4  # float32
MAMBA_HEADS, MAMBA_D_HEAD, MAMBA_D_STATE, MAMBA_D_CONV = 4, 64, 16, 4
MAMBA_STEP_TOKENS = 256  # prefill chunk of the Mamba hybrid


_ATTN = {"block_size": BLOCK_SIZE, "dtype": "float32"}


@dataclass(frozen=True)
class TinyModel:
    path: str
    # Layers per KV cache kind, for the byte predictions.
    full_layers: int
    swa_layers: int
    mamba_layers: int
    # vLLM engine kwargs this model needs.
    engine_kwargs: dict
    kv_dtype_bytes: int = DTYPE_BYTES
    # Un-padded bytes of one Mamba layer's state (conv + SSM).
    mamba_state_bytes: int = 0

    def attn_page_bytes(self, block_size: int = BLOCK_SIZE) -> int:
        """Bytes of one attention layer's KV block (K and V)."""
        return 2 * block_size * NUM_KV_HEADS * HEAD_DIM * self.kv_dtype_bytes


def _write_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2}
    vocab.update({f"t{i}": i for i in range(3, VOCAB_SIZE)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        unk_token="<pad>",
    )
    fast.save_pretrained(path)


def _save(model, path: Path) -> str:
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    _write_tokenizer(path)
    return str(path)


def _gemma3(path: Path, layer_types: list[str], seed: int) -> str:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=len(layer_types),
        num_attention_heads=2,
        num_key_value_heads=NUM_KV_HEADS,
        head_dim=HEAD_DIM,
        query_pre_attn_scalar=HEAD_DIM,
        sliding_window=WINDOW,
        layer_types=layer_types,
        max_position_embeddings=4096,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
        # Untied head and large random weights: the next token depends on the
        # whole context (corrupted KV changes it) and logits are far from ties.
        tie_word_embeddings=False,
        initializer_range=0.2,
    )
    config.architectures = ["Gemma3ForCausalLM"]
    model = Gemma3ForCausalLM(config).to(torch.float32)
    return _save(model, path)


def gemma3_hybrid(root: Path, seed: int = 0) -> TinyModel:
    """Gemma-3 text: 2 sliding-window (window 32) + 2 full-attention layers,
    block 32: two KV cache groups with the same page size."""
    types = ["sliding_attention", "full_attention"] * 2
    path = _gemma3(root / "gemma3-hybrid", types, seed)
    return TinyModel(
        path, full_layers=2, swa_layers=2, mamba_layers=0, engine_kwargs=_ATTN
    )


def gemma3_pure_swa(root: Path, seed: int = 1) -> TinyModel:
    """Gemma-3 text with sliding-window layers only (window 32, block 32): one
    SWA group, no full-attention alignment, the series falls back to the
    group's own chunk size."""
    path = _gemma3(root / "gemma3-swa", ["sliding_attention"] * 2, seed)
    return TinyModel(
        path, full_layers=0, swa_layers=2, mamba_layers=0, engine_kwargs=_ATTN
    )


def granite_hybrid(root: Path, seed: int = 2) -> TinyModel:
    """Granite-4.0-H style: 2 Mamba2 + 2 attention layers (no MoE experts
    beyond one); vLLM raises the block size to fit the Mamba state page."""
    from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM

    torch.manual_seed(seed)
    config = GraniteMoeHybridConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        shared_intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=NUM_KV_HEADS,
        layer_types=["mamba", "attention", "mamba", "attention"],
        num_local_experts=0,
        num_experts_per_tok=0,
        mamba_n_heads=MAMBA_HEADS,
        mamba_n_groups=1,
        mamba_d_state=MAMBA_D_STATE,
        mamba_d_head=MAMBA_D_HEAD,
        mamba_d_conv=MAMBA_D_CONV,
        mamba_expand=2,
        mamba_chunk_size=64,
        max_position_embeddings=4096,
        position_embedding_type="rope",
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
        initializer_range=0.2,
    )
    config.architectures = ["GraniteMoeHybridForCausalLM"]
    model = GraniteMoeHybridForCausalLM(config).to(torch.float32)
    path = _save(model, root / "granite-hybrid")
    # Mamba2 state per layer: conv state (d_conv - 1) x (inner + 2 * groups *
    # d_state) in the model dtype (bf16), SSM state heads x d_head x d_state
    # in float32 (mamba_ssm_cache_dtype below).
    conv_dim = 2 * 128 + 2 * 1 * MAMBA_D_STATE
    state = (
        MAMBA_D_CONV - 1
    ) * conv_dim * 2 + MAMBA_HEADS * MAMBA_D_HEAD * MAMBA_D_STATE * 4
    return TinyModel(
        path,
        full_layers=2,
        swa_layers=0,
        mamba_layers=2,
        engine_kwargs={
            # vLLM's C++ causal_conv1d kernel, used on CPUs with AVX-512
            # BF16, has no float32 version (AVX2 CPUs take a path that has):
            # bf16 everywhere, so outputs are compared like for like only.
            "dtype": "bfloat16",
            # "all" fails in the CPU causal_conv1d kernel; with "align" a
            # state is kept at the end of each prefill step, so prefill in
            # steps of MAMBA_STEP_TOKENS to have states to retain or drop.
            "mamba_cache_mode": "align",
            "max_num_batched_tokens": MAMBA_STEP_TOKENS,
            # vLLM's CPU platform forces a float32 SSM cache only on CPUs with
            # AVX-512 BF16; elsewhere "auto" means bf16 and other state bytes.
            # Fixed here so the byte predictions hold on every x86 CPU.
            "mamba_ssm_cache_dtype": "float32",
        },
        kv_dtype_bytes=2,
        mamba_state_bytes=state,
    )
