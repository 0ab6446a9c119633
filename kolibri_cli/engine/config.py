"""Model configuration read from a Hugging Face `config.json`: Llama, Mistral, Qwen2, Qwen3.

The four architectures differ only in switches the one kernel reads: q/k/v projection biases
(Qwen2), per-head RMSNorm on q and k (Qwen3), a sliding attention window (Mistral; Qwen2/3 when
`use_sliding_window`), and the RoPE frequency scaling (`RopeScaling`). Non-goals: o_proj/MLP
biases, partial rotary embeddings, dynamic/longrope scaling — refused with the name of what is
not supported.
"""

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from kolibri_cli.errors import KolibriError
from kolibri_cli.text import printable, shown

# architecture -> the model_type its config.json carries
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
ROPE_TYPES = ("default", "linear", "llama3", "yarn")
MAX_CONTEXT = 1 << 24  # positions are float32 in the RoPE tables: exact up to 2^24
MAX_LAYERS = 1024  # an order of magnitude above the deepest released decoders


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling, as transformers' `modeling_rope_utils` reads it."""

    rope_type: str = "default"  # one of ROPE_TYPES
    factor: float = 1.0  # linear, llama3, yarn
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_max_position_embeddings: int = 0  # llama3, yarn: the pre-training context
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    attention_factor: float | None = None  # yarn: cos/sin scale; None = from factor and mscale
    mscale: float = 0.0  # yarn
    mscale_all_dim: float = 0.0  # yarn
    truncate: bool = True  # yarn: round the correction range to whole dimensions


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int  # V
    hidden_size: int  # D
    intermediate_size: int  # F
    num_hidden_layers: int
    num_attention_heads: int  # H
    num_key_value_heads: int  # KVH; H % KVH == 0 (grouped-query attention)
    head_dim: int  # Dh; may differ from D / H (Qwen3)
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 2048  # context length
    tie_word_embeddings: bool = False
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    architecture: str = "LlamaForCausalLM"
    qkv_bias: bool = False  # q/k/v projections carry biases (Qwen2)
    qk_norm: bool = False  # RMSNorm over Dh on each q and k head before RoPE (Qwen3)
    sliding_window: int = 0  # W: a query sees the last W positions (itself included); 0 = all
    sliding_layers: tuple[int, ...] = ()  # layers that use the window (the others see all)
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        if not isinstance(d, dict):
            raise KolibriError("not a JSON object")
        arch = _architecture(d)
        model_type = d.get("model_type", ARCHITECTURES.get(arch))
        if ARCHITECTURES.get(arch) != model_type:
            known = ", ".join(f"{a} ({t})" for a, t in ARCHITECTURES.items())
            raise KolibriError(
                f"unsupported architecture {shown(arch)} (model_type {shown(model_type)}); "
                f"kolibri supports {known}"
            )
        try:
            config = cls(**_fields(d, model_type), architecture=arch)
        except KeyError as e:
            raise KolibriError(f"missing required field {shown(e.args[0])}") from None
        except (TypeError, ValueError, AttributeError, OverflowError) as e:
            raise KolibriError(f"a field has the wrong type ({printable(str(e), 120)})") from None
        config.validate()
        return config

    def validate(self) -> None:
        sizes = (self.vocab_size, self.hidden_size, self.intermediate_size, self.num_hidden_layers,
                 self.num_attention_heads, self.num_key_value_heads, self.head_dim)
        if min(sizes) < 1:
            raise KolibriError(f"sizes must be positive, got {sizes}")
        if not 1 <= self.max_position_embeddings <= MAX_CONTEXT:
            raise KolibriError(f"max_position_embeddings (the context length) must be in "
                               f"1..{MAX_CONTEXT}, got {self.max_position_embeddings}")
        if self.num_hidden_layers > MAX_LAYERS:
            raise KolibriError(f"num_hidden_layers {self.num_hidden_layers} is more than "
                               f"kolibri supports ({MAX_LAYERS})")
        floats = {"rope_theta": self.rope_theta, "rms_norm_eps": self.rms_norm_eps,
                  "rope factor": self.rope_scaling.factor}
        for name, value in floats.items():
            if not math.isfinite(value) or value < 0 or (value == 0 and name != "rms_norm_eps"):
                raise KolibriError(f"{name} must be a finite number > 0, got {value}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise KolibriError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise KolibriError(f"head_dim {self.head_dim} must be even for RoPE")
        if self.sliding_window < 0:
            raise KolibriError(f"sliding_window must be positive, got {self.sliding_window}")
        if self.rope_scaling.rope_type not in ROPE_TYPES:
            raise KolibriError(f"unsupported rope type {self.rope_scaling.rope_type!r} "
                               f"(kolibri implements {', '.join(ROPE_TYPES)})")

    @classmethod
    def from_file(cls, path: Path) -> "ModelConfig":
        try:
            d = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise KolibriError(f"{path}: not found — not a Hugging Face model folder") from None
        except OSError as e:
            raise KolibriError(f"{path}: cannot be read ({e.strerror})") from None
        except (ValueError, RecursionError) as e:  # JSON, UTF-8, 4300+ digit ints, deep nesting
            raise KolibriError(f"{path}: not valid JSON ({printable(str(e), 120)})") from None
        try:
            return cls.from_dict(d)
        except KolibriError as e:
            raise KolibriError(f"{path}: {e}") from None

    def layer_window(self, i: int) -> int:
        """The attention window of layer i (0 = the whole context)."""
        return self.sliding_window if i in self.sliding_layers else 0

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
            if self.qkv_bias:
                shapes |= {p + "self_attn.q_proj.bias": (H * Dh,),
                           p + "self_attn.k_proj.bias": (KVH * Dh,),
                           p + "self_attn.v_proj.bias": (KVH * Dh,)}
            if self.qk_norm:
                shapes |= {p + "self_attn.q_norm.weight": (Dh,),
                           p + "self_attn.k_norm.weight": (Dh,)}
        return shapes


def eos_token_ids(d: dict) -> tuple[int, ...]:
    """`eos_token_id` of a config.json or generation_config.json dict: an int, a list or absent."""
    eos = d.get("eos_token_id")
    ids = eos if isinstance(eos, list) else ([] if eos is None else [eos])
    if not all(isinstance(e, int) and not isinstance(e, bool) and e >= 0 for e in ids):
        raise ValueError(f"eos_token_id must be a token id or a list of them, got {shown(eos)}")
    return tuple(ids)


def _architecture(d: dict) -> str:
    archs = d.get("architectures") or ["LlamaForCausalLM"]
    arch = archs[0] if isinstance(archs, list) else archs
    if not isinstance(arch, str):
        raise KolibriError(f"architectures must be a list of names, got {shown(archs)}")
    return arch


def _whole(d: dict, key: str, default=None) -> int:
    """An integer field: a JSON int, or a float with no fraction (1e5); never a bool or text."""
    value = d.get(key)
    if value is None:
        if default is None:
            raise KeyError(key)
        value = default
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} must be a whole number, got {shown(value)}")
    return value


def _real(value, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key} must be a number, got {shown(value)}")
    return float(value)


def generation_eos(folder: Path, config: "ModelConfig") -> "ModelConfig":
    """transformers' generate stops on generation_config.json's eos ids when the folder has that
    file and it sets them; config.json's otherwise."""
    eos = generation_eos_ids(folder)
    return dataclasses.replace(config, eos_token_ids=eos) if eos else config


def generation_eos_ids(folder: Path) -> tuple[int, ...]:
    """generation_config.json's eos ids; () without the file or without them."""
    try:
        return eos_token_ids(_generation_config(folder))
    except (TypeError, ValueError):
        raise KolibriError(f"{Path(folder) / GENERATION_CONFIG}: not a valid generation config") \
            from None


GENERATION_CONFIG = "generation_config.json"
# transformers' GenerationConfig defaults for sampling, applied when the file sets do_sample
_SAMPLING_DEFAULTS = {"temperature": 1.0, "top_k": 50, "top_p": 1.0, "min_p": 0.0}


def generation_defaults(folder: Path) -> dict:
    """The sampling settings generation_config.json asks for, as transformers reads them:
    temperature (0 = greedy unless `do_sample`), top_k, top_p, min_p, repetition_penalty.
    {} without the file; only the keys the file implies."""
    gen, where = _generation_config(folder), Path(folder) / GENERATION_CONFIG
    out = {}
    if gen.get("repetition_penalty") is not None:
        out["repetition_penalty"] = _number(gen, "repetition_penalty", where)
    if not gen.get("do_sample"):
        return out | ({"temperature": 0.0} if gen else {})
    for key, default in _SAMPLING_DEFAULTS.items():
        out[key] = default if gen.get(key) is None else _number(gen, key, where)
    out["top_k"] = int(out["top_k"])
    return out


def _number(gen: dict, key: str, where: Path) -> float:
    value = gen[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise KolibriError(f"{where}: {key} must be a finite number, got {shown(value)}")
    return float(value)


def _generation_config(folder: Path) -> dict:
    path = Path(folder) / GENERATION_CONFIG
    if not path.is_file():
        return {}
    try:
        gen = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # unreadable, not JSON or UTF-8, too deep
        gen = None
    if not isinstance(gen, dict):
        raise KolibriError(f"{path}: not a valid generation config")
    return gen


def _fields(d: dict, model_type: str) -> dict:
    """The ModelConfig fields of an HF config dict (raises KeyError/TypeError/ValueError)."""
    # transformers >= 5 writes rope settings under "rope_parameters"; older files at top level.
    rope = d.get("rope_parameters") or {}
    n_heads, hidden = _whole(d, "num_attention_heads"), _whole(d, "hidden_size")
    n_layers = _whole(d, "num_hidden_layers")
    max_pos = _whole(d, "max_position_embeddings", 2048)
    if not 1 <= n_layers <= MAX_LAYERS or n_heads < 1:
        raise ValueError(f"num_hidden_layers {n_layers} must be in 1..{MAX_LAYERS} and "
                         f"num_attention_heads {n_heads} at least 1")
    _refuse_unsupported(d, model_type)
    eos_ids = eos_token_ids(d)
    window, window_layers = _sliding_window(d, model_type, n_layers)
    return dict(
        vocab_size=_whole(d, "vocab_size"),
        hidden_size=hidden,
        intermediate_size=_whole(d, "intermediate_size"),
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=_whole(d, "num_key_value_heads", 0) or n_heads,
        head_dim=_whole(d, "head_dim", 0) or hidden // n_heads,
        rope_theta=_real(d.get("rope_theta") or rope.get("rope_theta") or 10000.0, "rope_theta"),
        rms_norm_eps=_real(d.get("rms_norm_eps", 1e-5), "rms_norm_eps"),
        max_position_embeddings=max_pos,
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        eos_token_ids=eos_ids,
        qkv_bias=model_type == "qwen2",
        qk_norm=model_type == "qwen3",
        sliding_window=window,
        sliding_layers=window_layers,
        rope_scaling=_rope_scaling(d.get("rope_scaling") or rope, max_pos),
    )


def _refuse_unsupported(d: dict, model_type: str) -> None:
    """Options transformers honours that the kernel does not implement: refuse, never ignore."""
    if d.get("attention_bias") and model_type != "qwen2":
        raise KolibriError(f"attention_bias=true is not supported for {model_type} "
                           "(kolibri implements q/k/v biases for qwen2 only)")
    if d.get("mlp_bias"):
        raise KolibriError("mlp_bias=true is not supported")
    if d.get("hidden_act", "silu") != "silu":
        raise KolibriError(f"hidden_act {shown(d['hidden_act'])} is not supported (kolibri: silu)")
    rope = d.get("rope_scaling") or d.get("rope_parameters") or {}
    partial = rope.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise KolibriError(f"partial_rotary_factor {shown(partial)} is not supported "
                           "(kolibri: 1.0)")


def _sliding_window(d: dict, model_type: str, n_layers: int) -> tuple[int, tuple[int, ...]]:
    """(window, layers using it) the way each transformers model decides it."""
    window = d.get("sliding_window") if model_type != "llama" else None  # llama ignores it
    if model_type in ("qwen2", "qwen3") and not d.get("use_sliding_window", False):
        window = None
    if not window:
        return 0, ()
    types = d.get("layer_types")
    if types is not None:  # transformers >= 5 writes the per-layer decision
        layers = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    elif model_type in ("qwen2", "qwen3"):
        layers = tuple(range(int(d.get("max_window_layers", 28)), n_layers))
    else:
        layers = tuple(range(n_layers))
    return int(window), layers


def _rope_scaling(r: dict, max_pos: int) -> RopeScaling:
    rope_type = r.get("rope_type", r.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise KolibriError(f"unsupported rope type {rope_type!r} "
                           f"(kolibri implements {', '.join(ROPE_TYPES)})")
    if rope_type == "default":
        return RopeScaling()
    if "factor" not in r and not (rope_type == "yarn" and "original_max_position_embeddings" in r):
        raise KolibriError(f"rope type {rope_type!r} needs a 'factor'")
    original = int(r.get("original_max_position_embeddings") or max_pos)
    # yarn without factor: transformers takes the ratio of the two context lengths
    factor = r.get("factor") or max_pos / original
    opt = lambda key, default: default if r.get(key) is None else r[key]  # noqa: E731
    if rope_type == "llama3" and ("low_freq_factor" not in r or "high_freq_factor" not in r):
        raise KolibriError("rope type 'llama3' needs low_freq_factor and high_freq_factor")
    return RopeScaling(
        rope_type=rope_type,
        factor=float(factor),
        low_freq_factor=float(opt("low_freq_factor", 1.0)),
        high_freq_factor=float(opt("high_freq_factor", 4.0)),
        original_max_position_embeddings=original,
        beta_fast=float(r.get("beta_fast") or 32.0),
        beta_slow=float(r.get("beta_slow") or 1.0),
        attention_factor=None if opt("attention_factor", None) is None
        else float(r["attention_factor"]),
        mscale=float(opt("mscale", 0.0)),
        mscale_all_dim=float(opt("mscale_all_dim", 0.0)),
        truncate=bool(opt("truncate", True)),
    )
