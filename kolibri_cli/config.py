"""Model configuration read from a Hugging Face `config.json` (Llama family)."""

import json
from dataclasses import dataclass, field
from pathlib import Path

from kolibri_cli.errors import KolibriError

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM",)


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int  # V
    hidden_size: int  # D
    intermediate_size: int  # F
    num_hidden_layers: int
    num_attention_heads: int  # H
    num_key_value_heads: int  # KVH; H % KVH == 0 (grouped-query attention)
    head_dim: int  # Dh
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 2048  # context length
    tie_word_embeddings: bool = False
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    architecture: str = "LlamaForCausalLM"

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        archs = d.get("architectures") or ["LlamaForCausalLM"]
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES or d.get("model_type", "llama") != "llama":
            raise KolibriError(
                f"unsupported architecture {arch!r} (model_type {d.get('model_type')!r}); "
                f"kolibri supports {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        rope = d.get("rope_scaling")
        if rope and rope.get("rope_type", rope.get("type", "default")) != "default":
            raise KolibriError(f"unsupported rope type {rope.get('rope_type', rope.get('type'))!r}")
        try:
            n_heads = int(d["num_attention_heads"])
            hidden = int(d["hidden_size"])
            eos = d.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
            return cls(
                vocab_size=int(d["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(d["intermediate_size"]),
                num_hidden_layers=int(d["num_hidden_layers"]),
                num_attention_heads=n_heads,
                num_key_value_heads=int(d.get("num_key_value_heads") or n_heads),
                head_dim=int(d.get("head_dim") or hidden // n_heads),
                rope_theta=float(d.get("rope_theta", 10000.0)),
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-5)),
                max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                eos_token_ids=eos_ids,
                architecture=arch,
            )
        except KeyError as e:
            raise KolibriError(f"config.json lacks required field {e.args[0]!r}") from None

    @classmethod
    def from_file(cls, path: Path) -> "ModelConfig":
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except FileNotFoundError:
            raise KolibriError(f"{path}: no config.json — not a Hugging Face model folder") from None
        except json.JSONDecodeError as e:
            raise KolibriError(f"{path}: not valid JSON ({e})") from None

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor name a checkpoint must hold, with its shape (HF nn.Linear is [out, in])."""
        D, F, Dh = self.hidden_size, self.intermediate_size, self.head_dim
        H, KVH = self.num_attention_heads, self.num_key_value_heads
        shapes = {"model.embed_tokens.weight": (self.vocab_size, D), "model.norm.weight": (D,)}
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (self.vocab_size, D)
        for i in range(self.num_hidden_layers):
            p = f"model.layers.{i}."
            shapes |= {
                p + "input_layernorm.weight": (D,),
                p + "self_attn.q_proj.weight": (H * Dh, D),
                p + "self_attn.k_proj.weight": (KVH * Dh, D),
                p + "self_attn.v_proj.weight": (KVH * Dh, D),
                p + "self_attn.o_proj.weight": (D, H * Dh),
                p + "post_attention_layernorm.weight": (D,),
                p + "mlp.gate_proj.weight": (F, D),
                p + "mlp.up_proj.weight": (F, D),
                p + "mlp.down_proj.weight": (D, F),
            }
        return shapes
