"""Tiny seeded Llama checkpoints for real vLLM engines on a CPU.

A checkpoint is written from a seed alone (config.json, safetensors weights,
and a word-level tokenizer with a chat template), so a test needs no model
hub. The weights are random but not flat: the query and key projections are
scaled so that attention is sharp (a few positions dominate each softmax).
Greedy output then depends on which KV the model reads: a wrong block in a
prefix hit changes tokens, which is what makes a token comparison between
two KV-cache managers bite. vLLM's ``load_format="dummy"`` weights do not
have that property (their output barely depends on context).

Layouts:

* ``llama``: plain full attention (one KV-cache group);
* ``llama-swa``: the same model with ``layer_types`` alternating
  sliding-window and full attention (vLLM's Llama reads ``layer_types``), so
  vLLM builds a hybrid layout of a sliding-window and a full-attention group.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

#: Token ids 0-2 are the tokenizer's specials; words are "w3" ... "w{vocab-1}".
UNK, BOS, EOS = 0, 1, 2


@dataclass(frozen=True)
class TinyLlama:
    """Shape and seed of a tiny Llama checkpoint."""

    layout: str = "llama"
    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 512
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    sliding_window: int = 96
    seed: int = 0

    def config(self) -> dict[str, object]:
        config: dict[str, object] = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.hidden_size // self.num_heads,
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            "bos_token_id": BOS,
            "eos_token_id": EOS,
            "torch_dtype": "bfloat16",
        }
        if self.layout == "llama-swa":
            config["sliding_window"] = self.sliding_window
            config["layer_types"] = [
                "sliding_attention" if i % 2 == 0 else "full_attention"
                for i in range(self.num_layers)
            ]
        elif self.layout != "llama":
            raise ValueError(f"unknown tiny-model layout {self.layout!r}")
        return config


def write_checkpoint(directory: Path, model: TinyLlama = TinyLlama()) -> Path:
    """Write ``model`` into ``directory`` (created) and return it."""
    import torch
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(model.seed)
    h, inter, v = model.hidden_size, model.intermediate_size, model.vocab_size
    head_dim = h // model.num_heads
    kv = model.num_kv_heads * head_dim

    def normal(*shape: int, std: float) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * std).to(torch.bfloat16)

    # Attention logits have a standard deviation of about h * qk_std**2 for
    # unit-RMS inputs: 8 makes each softmax pick out a few positions.
    qk_std = (8.0 / h) ** 0.5
    tensors = {
        "model.embed_tokens.weight": normal(v, h, std=1.0),
        "model.norm.weight": torch.ones(h, dtype=torch.bfloat16),
        "lm_head.weight": normal(v, h, std=0.3),
    }
    for i in range(model.num_layers):
        p = f"model.layers.{i}."
        tensors |= {
            p + "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
            p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
            p + "self_attn.q_proj.weight": normal(h, h, std=qk_std),
            p + "self_attn.k_proj.weight": normal(kv, h, std=qk_std),
            p + "self_attn.v_proj.weight": normal(kv, h, std=h**-0.5),
            p + "self_attn.o_proj.weight": normal(h, h, std=h**-0.5),
            p + "mlp.gate_proj.weight": normal(inter, h, std=h**-0.5),
            p + "mlp.up_proj.weight": normal(inter, h, std=h**-0.5),
            p + "mlp.down_proj.weight": normal(h, inter, std=inter**-0.5),
        }
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(model.config(), indent=1))
    (directory / "generation_config.json").write_text(
        json.dumps({"bos_token_id": BOS, "eos_token_id": EOS})
    )
    write_tokenizer(directory, v)
    return directory


# A chat template that renders each message as "role : content" words, so
# chat requests tokenize into the same word-level vocabulary.
_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant : {% endif %}"
)


def write_tokenizer(directory: Path, vocab_size: int) -> None:
    """A word-level tokenizer: word ``w<i>`` is token ``i``; other words are
    ``<unk>``. Decoding joins words with spaces."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<unk>": UNK, "<s>": BOS, "</s>": EOS}
    vocab |= {f"w{i}": i for i in range(3, vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "model_max_length": 4096,
                "chat_template": _CHAT_TEMPLATE,
            }
        )
    )


def words(token_ids: list[int]) -> str:
    """The text that tokenizes to ``token_ids`` (ids of 3 and above)."""
    return " ".join(f"w{t}" for t in token_ids)
