"""What `kolibri model info` reports about a model folder, from headers only (no weights read)."""

from dataclasses import asdict, dataclass
from math import prod
from pathlib import Path

from kolibri_cli.engine import blockfile, loader
from kolibri_cli.engine.config import ModelConfig
from kolibri_cli.engine.tokenizer import Tokenizer
from kolibri_cli.store import cache


@dataclass
class ModelInfo:
    name: str
    path: str
    architecture: str
    parameters: int
    bytes_per_token: int  # weight bytes a decode step reads as stored (embedding lookup excluded)
    storage: dict[str, int]  # block type (Q4_1, Q8_0, F32, ...) -> tensors stored so
    dtypes: list[str]  # as on disk (safetensors dtypes; U8 for GGUF blocks)
    context_length: int
    layers: int
    hidden_size: int
    heads: int
    kv_heads: int
    head_dim: int
    gqa_ratio: int  # query heads per KV head
    vocab_size: int
    rope_type: str  # default, linear, llama3 or yarn
    rope_theta: float
    qkv_bias: bool  # q/k/v projection biases (Qwen2)
    qk_norm: bool  # per-head RMSNorm on q and k (Qwen3)
    tied_head: bool
    sliding_window: int  # 0 = every layer sees the whole context
    sliding_layers: int  # how many layers use the window
    chat_template: bool
    source: dict

    def to_dict(self) -> dict:
        return asdict(self)


def model_info(spec: str | None) -> ModelInfo:
    path = loader.check_folder(cache.resolve(spec, pull_missing=False))
    config = ModelConfig.from_file(path / "config.json")
    params, read, storage, dtypes = _weights_summary(path, config)
    meta = cache.provenance(path)
    return ModelInfo(
        name=cache.display_name(spec, meta), path=str(path),
        architecture=config.architecture, parameters=params, bytes_per_token=read,
        storage=storage, dtypes=dtypes,
        context_length=config.max_position_embeddings, layers=config.num_hidden_layers,
        hidden_size=config.hidden_size, heads=config.num_attention_heads,
        kv_heads=config.num_key_value_heads, head_dim=config.head_dim,
        gqa_ratio=config.num_attention_heads // config.num_key_value_heads,
        vocab_size=config.vocab_size, rope_type=config.rope_scaling.rope_type,
        rope_theta=config.rope_theta, qkv_bias=config.qkv_bias, qk_norm=config.qk_norm,
        tied_head=config.tie_word_embeddings, sliding_window=config.sliding_window,
        sliding_layers=len(config.sliding_layers),
        chat_template=bool(Tokenizer(Path(path)).chat_template),
        source=meta,
    )


def _weights_summary(path: Path, config: ModelConfig) -> tuple[int, int, dict[str, int], list]:
    """(parameters, bytes a decode step reads, storage types, on-disk dtypes), headers only."""
    shapes = config.weight_shapes()
    params = sum(prod(s) for s in shapes.values())
    unread = () if config.tie_word_embeddings else ("model.embed_tokens.weight",)
    if (path / blockfile.NAME).is_file():
        types, sizes = blockfile.storage(path / blockfile.NAME)
        read = sum(n for name, n in sizes.items() if name not in unread)
        return params, read, types, sorted({"F32", *("U8" for t in types if t != "F32")})
    index = {k: v for k, v in loader.tensor_index(path).items() if not k.endswith(loader.IGNORED)}
    read = 4 * sum(prod(s) for name, s in shapes.items() if name not in unread)
    return params, read, {"F32": len(shapes)}, sorted({dtype for dtype, _ in index.values()})
