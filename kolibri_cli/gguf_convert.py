"""GGUF (llama architecture) -> a Hugging Face-layout float32 folder.

Writes config.json, model.safetensors, tokenizer.json, tokenizer_config.json (chat template)
and generation_config.json. Non-goals: quantized inference (everything becomes float32) and
tokenizers other than gpt2-style byte-level BPE.
"""

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from kolibri_cli.atomic import default_mode
from kolibri_cli.errors import KolibriError

Progress = Callable[[int, int], None]  # (done, total)

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# Pre-tokenizers we can rebuild with `tokenizers`: GGUF `tokenizer.ggml.pre` -> digits split first?
_PRETOKENIZERS = {"smollm": True, "gpt-2": False, "default": False}


def hf_name(gguf_name: str) -> str:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    raise KolibriError(f"GGUF tensor {gguf_name!r} has no Hugging Face counterpart kolibri knows")


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (interleaved RoPE) -> HF rotate-half layout."""
    d_out, d_in = w.shape  # [H*Dh, D]
    head_dim = d_out // n_head
    return w.reshape(n_head, head_dim // 2, 2, d_in).swapaxes(1, 2).reshape(d_out, d_in)


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def read_config(reader) -> dict:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise KolibriError(f"GGUF architecture {arch!r} is not supported (kolibri reads 'llama')")
    def g(key: str, default=None):
        value = _field(reader, f"llama.{key}", default)
        if value is None:
            raise KolibriError(f"GGUF metadata lacks llama.{key}")
        return value

    n_head = int(g("attention.head_count"))
    hidden = int(g("embedding_length"))
    names = {t.name for t in reader.tensors}
    if "tokenizer.ggml.tokens" not in reader.fields:
        raise KolibriError("GGUF metadata lacks tokenizer.ggml.tokens (no vocabulary)")
    vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(g("vocab_size", vocab)),
        "hidden_size": hidden,
        "intermediate_size": int(g("feed_forward_length")),
        "num_hidden_layers": int(g("block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": int(g("attention.head_count_kv", n_head)),
        "head_dim": int(g("rope.dimension_count", hidden // n_head)),
        "rope_theta": float(g("rope.freq_base", 10000.0)),
        "rms_norm_eps": float(f"{g('attention.layer_norm_rms_epsilon', 1e-5):.7g}"),  # f32 -> 1e-05
        "max_position_embeddings": int(g("context_length", 2048)),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
    }


def dequantized_tensors(reader, config: dict, progress: Progress | None = None):
    """Yield (hf_name, float32 array [out, in]) for every tensor, Q/K un-permuted."""
    from gguf.quants import dequantize

    total = len(reader.tensors)
    for i, t in enumerate(reader.tensors):
        try:
            w = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        except NotImplementedError:
            raise KolibriError(
                f"GGUF tensor {t.name}: quantization {t.tensor_type.name} is not supported"
            ) from None
        name = hf_name(t.name)
        if name.endswith("q_proj.weight"):
            w = unpermute(w, config["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            w = unpermute(w, config["num_key_value_heads"])
        yield name, np.ascontiguousarray(w)
        if progress:
            progress(i + 1, total)


def build_tokenizer(reader):
    """A `tokenizers` byte-level BPE equal to llama.cpp's tokenization of this GGUF."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    model = _field(reader, "tokenizer.ggml.model")
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    if model != "gpt2":
        raise KolibriError(
            f"GGUF tokenizer model {model!r} is not supported (kolibri reads 'gpt2')"
        )
    if pre not in _PRETOKENIZERS:
        raise KolibriError(
            f"GGUF pre-tokenizer {pre!r} is not supported ({', '.join(_PRETOKENIZERS)})"
        )
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if _PRETOKENIZERS[pre]:
        digits = pre_tokenizers.Digits(individual_digits=True)
        tok.pre_tokenizer = pre_tokenizers.Sequence([digits, byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    control = [t for t, ty in zip(tokens, types, strict=True) if ty == 3]  # type 3: control
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    return tok


def tokenizer_config(reader) -> dict:
    tokens = reader.fields["tokenizer.ggml.tokens"]
    name = lambda key: (  # noqa: E731
        None if (i := _field(reader, key)) is None else tokens.contents(int(i))
    )
    cfg = {
        "bos_token": name("tokenizer.ggml.bos_token_id"),
        "eos_token": name("tokenizer.ggml.eos_token_id"),
        "unk_token": name("tokenizer.ggml.unknown_token_id"),
        "pad_token": name("tokenizer.ggml.padding_token_id"),
        "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        "clean_up_tokenization_spaces": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    template = _field(reader, "tokenizer.chat_template")
    if template:
        cfg["chat_template"] = template
    return cfg


def convert(gguf_path: Path, out_dir: Path, progress: Progress | None = None) -> None:
    """Write the HF-layout float32 folder for `gguf_path` into `out_dir` (which must exist)."""
    import gguf
    from safetensors.numpy import save_file

    reader = gguf.GGUFReader(str(gguf_path))
    config = read_config(reader)
    tensors = dict(dequantized_tensors(reader, config, progress))
    weights = out_dir / "model.safetensors"
    save_file(tensors, str(weights), metadata={"format": "pt"})
    weights.chmod(default_mode(is_dir=False))  # safetensors writes via a 0o600 temporary
    build_tokenizer(reader).save(str(out_dir / "tokenizer.json"))
    write = lambda name, obj: (out_dir / name).write_text(json.dumps(obj, indent=2) + "\n")  # noqa: E731
    write("config.json", config)
    write("tokenizer_config.json", tokenizer_config(reader))
    gen = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
    write("generation_config.json", gen)
