"""What `kolibri model info` reports about a model folder, from headers only (no weights read)."""

from dataclasses import asdict, dataclass
from math import prod
from pathlib import Path

from kolibri_cli.engine import loader
from kolibri_cli.engine.config import ModelConfig
from kolibri_cli.engine.tokenizer import Tokenizer
from kolibri_cli.store import cache


@dataclass
class ModelInfo:
    name: str
    path: str
    architecture: str
    parameters: int
    bytes_per_token: int  # float32 weights one decode step reads (the embedding lookup excluded)
    dtypes: list[str]  # as stored on disk; kolibri holds every tensor as float32
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
    index = {k: v for k, v in loader.tensor_index(path).items() if not k.endswith(loader.IGNORED)}
    # A tied checkpoint may still carry lm_head.weight (a copy of the embedding): not counted.
    params = sum(prod(shape) for name, (_, shape) in index.items()
                 if not (name == "lm_head.weight" and config.tie_word_embeddings))
    embed = config.vocab_size * config.hidden_size
    read = params - (0 if config.tie_word_embeddings else embed)  # untied: embedding not read
    meta = cache.provenance(path)
    return ModelInfo(
        name=cache.display_name(spec, meta), path=str(path),
        architecture=config.architecture, parameters=params, bytes_per_token=4 * read,
        dtypes=sorted({dtype for dtype, _ in index.values()}),
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
