"""Weights laid out once for the kernel: fused QKV and gate/up matrices, float32, C-contiguous.

Optional parts (q/k/v biases, q/k norms) are zero-length arrays when the architecture lacks
them: the kernel tests `.shape[0]`, so the plain Llama path pays one branch, not a copy.
"""

from dataclasses import dataclass, field

import numpy as np

from kolibri_cli.engine.config import ModelConfig


def _none() -> np.ndarray:
    return np.zeros(0, np.float32)  # [0]: "this layer has no such part"


@dataclass
class LayerWeights:
    attn_norm: np.ndarray  # [D]
    wqkv: np.ndarray  # [(H + 2*KVH) * Dh, D]  rows: q heads, then k heads, then v heads
    wo: np.ndarray  # [D, H*Dh]
    mlp_norm: np.ndarray  # [D]
    w_gate_up: np.ndarray  # [2F, D]  rows: gate then up
    w_down: np.ndarray  # [D, F]
    bqkv: np.ndarray = field(default_factory=_none)  # [(H + 2*KVH) * Dh] biases (Qwen2) | [0]
    q_norm: np.ndarray = field(default_factory=_none)  # [Dh] q head RMSNorm (Qwen3) | [0]
    k_norm: np.ndarray = field(default_factory=_none)  # [Dh] k head RMSNorm (Qwen3) | [0]

    def arrays(self) -> tuple[np.ndarray, ...]:
        """The tuple the kernel's `_layer` unpacks (order matters)."""
        return (self.attn_norm, self.wqkv, self.wo, self.mlp_norm, self.w_gate_up, self.w_down,
                self.bqkv, self.q_norm, self.k_norm)


@dataclass
class Weights:
    embed: np.ndarray  # [V, D]
    layers: list[LayerWeights]
    norm: np.ndarray  # [D]
    head: np.ndarray  # [V, D]; the same array as `embed` when tied

    def nbytes_per_token(self) -> int:
        """Bytes of weights a decode step reads: every layer matrix, the norms and the head."""
        layer = sum(a.nbytes for lw in self.layers for a in vars(lw).values())
        return layer + self.norm.nbytes + self.head.nbytes


def _f32(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def _layer(config: ModelConfig, tensors: dict[str, np.ndarray], i: int) -> LayerWeights:
    p = f"model.layers.{i}."
    t = lambda name: tensors[p + name]  # noqa: E731
    lw = LayerWeights(
        attn_norm=_f32(t("input_layernorm.weight")),
        wqkv=_f32(np.concatenate([t(f"self_attn.{x}_proj.weight") for x in "qkv"])),
        wo=_f32(t("self_attn.o_proj.weight")),
        mlp_norm=_f32(t("post_attention_layernorm.weight")),
        w_gate_up=_f32(np.concatenate([t("mlp.gate_proj.weight"), t("mlp.up_proj.weight")])),
        w_down=_f32(t("mlp.down_proj.weight")),
    )
    if config.qkv_bias:
        lw.bqkv = _f32(np.concatenate([t(f"self_attn.{x}_proj.bias") for x in "qkv"]))
    if config.qk_norm:
        lw.q_norm = _f32(t("self_attn.q_norm.weight"))
        lw.k_norm = _f32(t("self_attn.k_norm.weight"))
    return lw


def layout(config: ModelConfig, tensors: dict[str, np.ndarray]) -> Weights:
    """HF tensor names -> kernel layout (`tensors` already checked against weight_shapes())."""
    layers = [_layer(config, tensors, i) for i in range(config.num_hidden_layers)]
    embed = _f32(tensors["model.embed_tokens.weight"])
    head = embed if config.tie_word_embeddings else _f32(tensors["lm_head.weight"])
    return Weights(embed=embed, layers=layers, norm=_f32(tensors["model.norm.weight"]), head=head)


def random_weights(config: ModelConfig, seed: int = 0, scale: float = 0.02) -> Weights:
    """Random weights for tests and kernel benchmarks (no checkpoint needed)."""
    rng = np.random.default_rng(seed)
    tensors = {
        name: (1.0 + scale * rng.standard_normal(shape)) if name.endswith("norm.weight")
        else scale * rng.standard_normal(shape)
        for name, shape in config.weight_shapes().items()
    }
    return layout(config, tensors)
