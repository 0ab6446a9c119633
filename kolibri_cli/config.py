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
        if not isinstance(d, dict):
            raise KolibriError("not a JSON object")
        archs = d.get("architectures") or ["LlamaForCausalLM"]
        arch = archs[0] if isinstance(archs, list) else archs
        if arch not in SUPPORTED_ARCHITECTURES or d.get("model_type", "llama") != "llama":
            raise KolibriError(
                f"unsupported architecture {arch!r} (model_type {d.get('model_type')!r}); "
                f"kolibri supports {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        try:
            config = cls(**_fields(d), architecture=arch)
        except KeyError as e:
            raise KolibriError(f"missing required field {e.args[0]!r}") from None
        except (TypeError, ValueError, AttributeError) as e:
            raise KolibriError(f"a field has the wrong type ({e})") from None
        config.validate()
        return config

    def validate(self) -> None:
        sizes = (self.vocab_size, self.hidden_size, self.intermediate_size, self.num_hidden_layers,
                 self.num_attention_heads, self.num_key_value_heads, self.head_dim)
        if min(sizes) < 1:
            raise KolibriError(f"sizes must be positive, got {sizes}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise KolibriError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise KolibriError(f"head_dim {self.head_dim} must be even for RoPE")

    @classmethod
    def from_file(cls, path: Path) -> "ModelConfig":
        try:
            d = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise KolibriError(f"{path}: not found — not a Hugging Face model folder") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise KolibriError(f"{path}: not valid JSON ({e})") from None
        try:
            return cls.from_dict(d)
        except KolibriError as e:
            raise KolibriError(f"{path}: {e}") from None

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


def _fields(d: dict) -> dict:
    """The ModelConfig fields of an HF config dict (raises KeyError/TypeError/ValueError)."""
    # transformers >= 5 writes rope settings under "rope_parameters"; older files at top level.
    rope = d.get("rope_parameters") or {}
    scaling = d.get("rope_scaling") or rope
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type != "default":
        raise KolibriError(f"unsupported rope type {rope_type!r} (kolibri implements 'default')")
    n_heads, hidden = int(d["num_attention_heads"]), int(d["hidden_size"])
    eos = d.get("eos_token_id")
    eos_ids = tuple(int(e) for e in eos) if isinstance(eos, list) else (
        () if eos is None else (int(eos),))
    return dict(
        vocab_size=int(d["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(d["intermediate_size"]),
        num_hidden_layers=int(d["num_hidden_layers"]),
        num_attention_heads=n_heads,
        num_key_value_heads=int(d.get("num_key_value_heads") or n_heads),
        head_dim=int(d.get("head_dim") or hidden // n_heads),
        rope_theta=float(d.get("rope_theta") or rope.get("rope_theta") or 10000.0),
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-5)),
        max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        eos_token_ids=eos_ids,
    )
