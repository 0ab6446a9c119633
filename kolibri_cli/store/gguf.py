"""GGUF (llama, qwen2, qwen3 architectures) -> a Hugging Face-layout float32 folder.

Writes config.json, model.safetensors, tokenizer.json, tokenizer_config.json (chat template)
and generation_config.json. Every tensor type `gguf.quants.dequantize` reads is accepted (F32,
F16, BF16, Q4_0/1, Q5_0/1, Q8_0, the K-quants, ...). llama.cpp stores llama Q/K rows permuted for
its interleaved RoPE (undone here); qwen2/qwen3 use rotate-half RoPE and are stored as-is.
RoPE scaling comes from `{arch}.rope.scaling.*`, or for Llama 3.x from the `rope_freqs` tensor,
accepted only when the Llama 3 formula reproduces it. Non-goals: quantized inference (everything
becomes float32) and tokenizers other than gpt2-style byte-level BPE with the pre-tokenizers in
PRETOKENIZERS.
"""

import json
from pathlib import Path

import numpy as np

from kolibri_cli.callbacks import Ticks
from kolibri_cli.errors import KolibriError
from kolibri_cli.store.atomic import default_mode

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
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
# GGUF general.architecture -> (HF architecture, model_type)
ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
}
SKIPPED = ("rope_freqs.weight",)  # llama.cpp's Llama 3 frequency factors: read into the config
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# The split regexes of llama.cpp's pre-tokenizers (llama-vocab.cpp), as the HF tokenizer.json
# of those models writes them. None: GPT-2's own regex (ByteLevel use_regex=True).
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# GGUF `tokenizer.ggml.pre` -> (split regex or None, digits split one by one first, NFC first)
PRETOKENIZERS = {
    "smollm": (None, True, False),
    "gpt-2": (None, False, False),
    "default": (None, False, False),
    "llama-bpe": (_LLAMA3, False, False),
    "qwen2": (_QWEN2, False, True),
}


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


def gguf_architecture(reader) -> str:
    arch = _field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise KolibriError(f"GGUF architecture {arch!r} is not supported "
                           f"(kolibri reads {', '.join(ARCHITECTURES)})")
    return arch


def read_config(reader) -> dict:
    arch = gguf_architecture(reader)

    def g(key: str, default=None):
        value = _field(reader, f"{arch}.{key}", default)
        if value is None:
            raise KolibriError(f"GGUF metadata lacks {arch}.{key}")
        return value

    n_head = int(g("attention.head_count"))
    hidden = int(g("embedding_length"))
    names = {t.name for t in reader.tensors}
    if "tokenizer.ggml.tokens" not in reader.fields:
        raise KolibriError("GGUF metadata lacks tokenizer.ggml.tokens (no vocabulary)")
    vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    head_dim = int(g("attention.key_length", hidden // n_head))
    if int(g("rope.dimension_count", head_dim)) != head_dim:
        raise KolibriError(f"GGUF {arch}.rope.dimension_count differs from the head size "
                           f"{head_dim} (partial RoPE is not supported)")
    hf_arch, model_type = ARCHITECTURES[arch]
    config = {
        "architectures": [hf_arch],
        "model_type": model_type,
        "vocab_size": int(g("vocab_size", vocab)),
        "hidden_size": hidden,
        "intermediate_size": int(g("feed_forward_length")),
        "num_hidden_layers": int(g("block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": int(g("attention.head_count_kv", n_head)),
        "head_dim": head_dim,
        "rope_theta": float(g("rope.freq_base", 10000.0)),
        "rms_norm_eps": float(f"{g('attention.layer_norm_rms_epsilon', 1e-5):.7g}"),  # f32 -> 1e-05
        "max_position_embeddings": int(g("context_length", 2048)),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }
    rope = _rope_scaling(reader, arch, config)
    if rope:
        config["rope_scaling"] = rope
    return config


def _rope_scaling(reader, arch: str, config: dict) -> dict | None:
    """The HF rope_scaling dict for the GGUF's `{arch}.rope.scaling.*` keys or `rope_freqs`."""
    kind = _field(reader, f"{arch}.rope.scaling.type", "none")
    factor = _field(reader, f"{arch}.rope.scaling.factor")
    original = _field(reader, f"{arch}.rope.scaling.original_context_length")
    freqs = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if freqs is not None:
        return _llama3_scaling(_dequantize(freqs), config)
    if kind == "none" or (kind == "linear" and factor in (None, 1.0)):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(factor)}
    if kind == "yarn" and factor is not None:
        out = {"rope_type": "yarn", "factor": float(factor)}
        if original:
            out["original_max_position_embeddings"] = int(original)
        return out
    raise KolibriError(f"GGUF rope scaling {kind!r} is not supported (kolibri: linear, yarn, "
                       "Llama 3 rope_freqs)")


def _llama3_scaling(freqs: np.ndarray, config: dict) -> dict:
    """llama.cpp keeps only Llama 3's per-frequency divisors: recover the HF parameters (the
    released 3.1/3.2 values: low 1, high 4, original context 8192; factor = the largest divisor)
    and accept them only if they reproduce every divisor."""
    import dataclasses

    from kolibri_cli.engine.config import ModelConfig
    from kolibri_cli.engine.rope import rope_frequencies

    scaling = {"rope_type": "llama3", "factor": float(freqs.max()), "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    c = ModelConfig.from_dict(config | {"rope_scaling": scaling})
    plain = rope_frequencies(dataclasses.replace(c, rope_scaling=type(c.rope_scaling)()))[0]
    divisors = plain / rope_frequencies(c)[0]
    if divisors.shape != freqs.shape or not np.allclose(divisors, freqs, rtol=1e-4):
        raise KolibriError("GGUF rope_freqs are not Llama 3.1/3.2 frequency scaling; "
                           "kolibri cannot reproduce this RoPE")
    return scaling


def check_tensor_types(reader) -> None:
    """Refuse, before any work, a tensor type `gguf.quants.dequantize` cannot read."""
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import _type_traits

    for t in reader.tensors:
        if t.tensor_type not in (Q.F32, Q.F16) and t.tensor_type not in _type_traits:
            raise KolibriError(f"GGUF tensor {t.name}: quantization {t.tensor_type.name} is not "
                               "supported (the gguf library cannot dequantize it)")


def _dequantize(t) -> np.ndarray:
    from gguf.quants import dequantize

    try:
        return dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
    except NotImplementedError:
        raise KolibriError(
            f"GGUF tensor {t.name}: quantization {t.tensor_type.name} is not supported"
        ) from None


def float32_bytes(reader) -> int:
    """Bytes the model takes as float32 (the cache folder, and the weights in memory)."""
    return sum(4 * int(t.n_elements) for t in reader.tensors if t.name not in SKIPPED)


def dequantized_tensors(reader, config: dict, progress: Ticks | None = None):
    """Yield (hf_name, float32 array [out, in]) for every tensor; llama Q/K un-permuted."""
    permuted = config["model_type"] == "llama"  # llama.cpp permutes only llama's Q/K rows
    tensors = [t for t in reader.tensors if t.name not in SKIPPED]
    for i, t in enumerate(tensors):
        w = _dequantize(t)
        name = hf_name(t.name)
        if permuted and name.endswith("q_proj.weight"):
            w = unpermute(w, config["num_attention_heads"])
        elif permuted and name.endswith("k_proj.weight"):
            w = unpermute(w, config["num_key_value_heads"])
        yield name, np.ascontiguousarray(w)
        if progress:
            progress(i + 1, len(tensors))


def build_tokenizer(reader):
    """A `tokenizers` byte-level BPE equal to llama.cpp's tokenization of this GGUF."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers as pre_tok

    model = _field(reader, "tokenizer.ggml.model")
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    if model != "gpt2":
        raise KolibriError(
            f"GGUF tokenizer model {model!r} is not supported (kolibri reads 'gpt2')"
        )
    if pre not in PRETOKENIZERS:
        raise KolibriError(
            f"GGUF pre-tokenizer {pre!r} is not supported ({', '.join(PRETOKENIZERS)})"
        )
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    regex, digits, nfc = PRETOKENIZERS[pre]
    steps = [pre_tok.Digits(individual_digits=True)] if digits else []
    if regex is None:
        steps.append(pre_tok.ByteLevel(add_prefix_space=False, use_regex=True))
    else:
        steps += [pre_tok.Split(Regex(regex), behavior="isolated", invert=False),
                  pre_tok.ByteLevel(add_prefix_space=False, use_regex=False)]
    tok.pre_tokenizer = steps[0] if len(steps) == 1 else pre_tok.Sequence(steps)
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    # token types: 3 control (special), 4 user-defined (added, matched whole, not special)
    control = [t for t, ty in zip(tokens, types, strict=True) if ty == 3]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    user = [t for t, ty in zip(tokens, types, strict=True) if ty == 4]
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])
    _add_bos(tok, reader, tokens)
    return tok


def _add_bos(tok, reader, tokens) -> None:
    """A GGUF that asks for BOS (Llama 3) gets it from the tokenizer, as HF's tokenizer.json."""
    from tokenizers import processors

    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    if not _field(reader, "tokenizer.ggml.add_bos_token", False) or bos is None:
        return
    name = tokens[int(bos)]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{name}:0 $A:0", pair=f"{name}:0 $A:0 {name}:1 $B:1",
        special_tokens=[(name, int(bos))])


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


def convert(gguf_path: Path, out_dir: Path, progress: Ticks | None = None) -> None:
    """Write the HF-layout float32 folder for `gguf_path` into `out_dir` (which must exist)."""
    import gguf
    from safetensors.numpy import save_file

    reader = gguf.GGUFReader(str(gguf_path))
    config = read_config(reader)
    check_tensor_types(reader)
    tokenizer = build_tokenizer(reader)  # refuses an unknown tokenizer before the slow part
    tensors = dict(dequantized_tensors(reader, config, progress))
    weights = out_dir / "model.safetensors"
    save_file(tensors, str(weights), metadata={"format": "pt"})
    weights.chmod(default_mode(is_dir=False))  # safetensors writes via a 0o600 temporary
    tokenizer.save(str(out_dir / "tokenizer.json"))
    write = lambda name, obj: (out_dir / name).write_text(json.dumps(obj, indent=2) + "\n")  # noqa: E731
    write("config.json", config)
    write("tokenizer_config.json", tokenizer_config(reader))
    gen = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
    write("generation_config.json", gen)
