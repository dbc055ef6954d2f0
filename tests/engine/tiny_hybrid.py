"""A tiny seeded hybrid linear-attention + full-attention checkpoint for vLLM
on a CPU.

Architecture: ``Qwen3_5ForCausalLM`` (``model_type`` ``qwen3_5_text``, the
dense Qwen3.5 text model): layers alternate Gated DeltaNet linear attention
(``layer_types`` ``"linear_attention"``, vLLM's ``QwenGatedDeltaNetAttention``,
a Mamba-style recurrent state) and gated full attention with QK-norm and
partial RoPE (``"full_attention"``); every layer has a dense SwiGLU MLP. vLLM
builds two KV-cache groups: a ``MambaSpec`` group (conv + recurrent state)
and a full-attention group.

Why this one: among the hybrids vLLM 0.32/0.33 ship, it is the one whose
state layer has complete CPU kernels *with prefix caching*:

* Mamba2 hybrids (GraniteMoeHybrid, NemotronH, FalconH1, Zamba2) load and
  run on the CPU with prefix caching off, but with it on (Mamba
  ``mamba_cache_mode="align"``) ``MambaMixer2`` always exports in-prefill
  checkpoints (``num_prefill_checkpoint_blocks=1``) and the CPU chunk scan
  (``ops/cpu/mamba_ssm._mamba_chunk_scan_combined_fwd_cpu``) ignores
  ``return_intermediate_states``: the first prefill that crosses a
  checkpoint fails with ``IndexError: index 3 is out of bounds for dimension
  0 with size 2`` at ``varlen_states[last_chunk_indices_p]``
  (``mamba_mixer2.py``), in both versions;
* Mamba1 (Jamba, Mamba) needs ``torch.ops._C.selective_scan_fwd``, which the
  CPU build does not have; OLMo-Hybrid's GDN has no CPU path;
* Qwen3-Next is the same GDN layer with MoE; dense Qwen3.5 keeps MoE out.

On the CPU the GDN layer does not export in-prefill checkpoints (only the
FlashInfer backend does), so in align mode vLLM's scheduler splits prefills
at block boundaries instead.

Kernel and page-size constraints behind the sizes: the CPU GDN kernel
(``chunk_gated_delta_rule_cpu``) takes key head dim = value head dim, 64 or
128; the conv-weight prepack wants the conv width (2 x key + value dims) a
multiple of 32. The recurrent state is float32 (the CPU platform resets a
non-bfloat16 SSM cache dtype to float32): 64 x 64 x 4 = 16 KiB plus a 1.1 KiB
bfloat16 conv state per layer, which fits one 32-token attention page (32 x
2 x 4 KV heads x 64 x 2 bytes = 32 KiB), so vLLM's hybrid alignment keeps
``block_size=32`` and pads the Mamba page up to the attention page.

As in :mod:`tiny_models`, the weights are random but attention is sharp (the
QK-norm gains are set so that logits have a standard deviation of about 8),
so greedy output depends on which KV blocks are read; the GDN decays spread
over short and long time scales, so output also depends on the restored
recurrent state.

Prefix caching for the Mamba group is vLLM's ``mamba_cache_mode="align"``,
which vLLM 0.32 and 0.33 derive from ``enable_prefix_caching`` (0.33
deprecates the explicit argument), so :data:`HYBRID_ENGINE_ARGS` is empty.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from tiny_models import BOS, EOS, write_tokenizer  # tests/engine is on sys.path

#: Extra ``vllm.LLM`` keyword arguments the hybrid needs: none. Mamba "align"
#: caching follows ``enable_prefix_caching``, and ``block_size=32`` holds.
HYBRID_ENGINE_ARGS: dict[str, object] = {}

VOCAB_SIZE = 4096
HIDDEN = 256
INTERMEDIATE = 512
NUM_LAYERS = 4
LAYER_TYPES = ["linear_attention", "full_attention"] * (NUM_LAYERS // 2)
NUM_HEADS = 4
NUM_KV_HEADS = 4
HEAD_DIM = 64
GDN_KEY_HEADS = 1
GDN_VALUE_HEADS = 1
GDN_HEAD_DIM = 64  # key and value head dims (the CPU kernel wants them equal)
GDN_CONV = 4


def hybrid_config() -> dict[str, object]:
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": NUM_LAYERS,
        "layer_types": LAYER_TYPES,
        "num_attention_heads": NUM_HEADS,
        "num_key_value_heads": NUM_KV_HEADS,
        "head_dim": HEAD_DIM,
        "attn_output_gate": True,
        "attention_bias": False,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
        },
        "partial_rotary_factor": 0.25,
        "linear_num_key_heads": GDN_KEY_HEADS,
        "linear_num_value_heads": GDN_VALUE_HEADS,
        "linear_key_head_dim": GDN_HEAD_DIM,
        "linear_value_head_dim": GDN_HEAD_DIM,
        "linear_conv_kernel_dim": GDN_CONV,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "torch_dtype": "bfloat16",
    }


def write_hybrid_checkpoint(directory: Path, seed: int = 0) -> Path:
    """Write the tiny hybrid checkpoint for ``seed`` into ``directory``
    (created) and return it."""
    import torch
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    h, inter, v = HIDDEN, INTERMEDIATE, VOCAB_SIZE
    q_dim, kv_dim = NUM_HEADS * HEAD_DIM, NUM_KV_HEADS * HEAD_DIM
    key_dim, value_dim = GDN_KEY_HEADS * GDN_HEAD_DIM, GDN_VALUE_HEADS * GDN_HEAD_DIM
    conv_dim = 2 * key_dim + value_dim  # q, k, v go through the conv
    bf16 = torch.bfloat16

    def normal(*shape: int, std: float) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * std).to(bf16)

    def uniform(n: int, lo: float, hi: float) -> torch.Tensor:
        return torch.rand(n, generator=gen) * (hi - lo) + lo

    def full(n: int, value: float) -> torch.Tensor:
        return torch.full((n,), value, dtype=bf16)

    # Qwen3.5's RMSNorms scale by (1 + weight): 0 is a gain of 1. QK-norm
    # makes q and k unit-RMS per head, so a gain g on both gives attention
    # logits a standard deviation of about g**2: 8 is sharp, as in tiny_models.
    qk_gain = 8.0**0.5
    tensors = {
        "model.embed_tokens.weight": normal(v, h, std=1.0),
        "model.norm.weight": full(h, 0.0),
        "lm_head.weight": normal(v, h, std=0.3),
    }
    for i, kind in enumerate(LAYER_TYPES):
        p = f"model.layers.{i}."
        tensors |= {
            p + "input_layernorm.weight": full(h, 0.0),
            p + "post_attention_layernorm.weight": full(h, 0.0),
            p + "mlp.gate_proj.weight": normal(inter, h, std=h**-0.5),
            p + "mlp.up_proj.weight": normal(inter, h, std=h**-0.5),
            p + "mlp.down_proj.weight": normal(h, inter, std=inter**-0.5),
        }
        if kind == "full_attention":
            tensors |= {
                # q_proj carries the query and its output gate (2 x q_dim).
                p + "self_attn.q_proj.weight": normal(2 * q_dim, h, std=h**-0.5),
                p + "self_attn.k_proj.weight": normal(kv_dim, h, std=h**-0.5),
                p + "self_attn.v_proj.weight": normal(kv_dim, h, std=h**-0.5),
                p + "self_attn.o_proj.weight": normal(h, q_dim, std=q_dim**-0.5),
                p + "self_attn.q_norm.weight": full(HEAD_DIM, qk_gain - 1.0),
                p + "self_attn.k_norm.weight": full(HEAD_DIM, qk_gain - 1.0),
            }
            continue
        # Gated DeltaNet: decay exp(-exp(A_log) * softplus(a + dt_bias)) with
        # step sizes in [0.01, 0.2] and A in [1, 16]: from ~1 (long memory)
        # down to ~0.04 (short memory).
        dt = uniform(GDN_VALUE_HEADS, math.log(0.01), math.log(0.2)).exp()
        tensors |= {
            p + "linear_attn.in_proj_qkv.weight": normal(conv_dim, h, std=h**-0.5),
            p + "linear_attn.in_proj_z.weight": normal(value_dim, h, std=h**-0.5),
            p + "linear_attn.in_proj_b.weight": normal(GDN_VALUE_HEADS, h, std=h**-0.5),
            p + "linear_attn.in_proj_a.weight": normal(GDN_VALUE_HEADS, h, std=h**-0.5),
            p + "linear_attn.conv1d.weight": normal(conv_dim, 1, GDN_CONV, std=GDN_CONV**-0.5),
            p + "linear_attn.dt_bias": (dt + torch.log(-torch.expm1(-dt))).to(bf16),
            p + "linear_attn.A_log": uniform(GDN_VALUE_HEADS, 0.0, math.log(16.0)).to(bf16),
            # The gated output norm scales by its weight (not 1 + weight).
            p + "linear_attn.norm.weight": full(GDN_HEAD_DIM, 1.0),
            p + "linear_attn.out_proj.weight": normal(h, value_dim, std=value_dim**-0.5),
        }
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(hybrid_config(), indent=1))
    (directory / "generation_config.json").write_text(
        json.dumps({"bos_token_id": BOS, "eos_token_id": EOS})
    )
    write_tokenizer(directory, v)
    return directory


if __name__ == "__main__":  # pragma: no cover
    import sys

    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    print(write_hybrid_checkpoint(Path(sys.argv[1]), seed))
