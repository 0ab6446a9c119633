"""GGUF (llama, qwen2, qwen3 architectures) -> a kolibri model folder.

Writes config.json, tokenizer.json, tokenizer_config.json (chat template),
generation_config.json and the weights' index (`engine.blockfile`): tensors the kernel reads in
a GGUF kept in the folder stay there, read in place; the rest (every tensor of a GGUF kept
elsewhere) go to blocks.bin — the GGUF's own blocks, or float32 rows for the types only
`gguf.quants.dequantize` reads. llama.cpp stores llama Q/K rows permuted for its interleaved
RoPE: the index says so and the loader addresses them in Hugging Face order (`unpermute` does
the same to a dequantized matrix); qwen2/qwen3 use rotate-half RoPE and are stored as-is.
RoPE scaling comes from `{arch}.rope.scaling.*`, or for Llama 3.x from the `rope_freqs` tensor,
accepted only when the Llama 3 formula reproduces it. Non-goals: tokenizers other than
gpt2-style byte-level BPE with the pre-tokenizers in PRETOKENIZERS."""

import json
import math
from pathlib import Path

import numpy as np

from kolibri_cli.callbacks import Ticks
from kolibri_cli.errors import KolibriError
from kolibri_cli.text import shown

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
    if f is None:
        return default
    try:
        return f.contents()
    except (UnicodeDecodeError, ValueError, IndexError, TypeError) as e:
        raise KolibriError(f"GGUF metadata {key} is unreadable ({e})") from None


def _typed(reader, key: str, kind, what: str, default=None):
    """`key`'s value if it is a `kind` (never a bool standing in for a number), else `default`
    when absent; anything else is a KolibriError naming the key."""
    value = _field(reader, key, default)
    if value is None:
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise KolibriError(f"GGUF metadata {key} must be {what}, got {shown(value)}")
    return value


def _whole(reader, key: str, default=None, low: int = 1) -> int:
    value = _typed(reader, key, int, "a whole number", default)
    if value is None:
        raise KolibriError(f"GGUF metadata lacks {key}")
    if value < low:
        raise KolibriError(f"GGUF metadata {key} must be >= {low}, got {value}")
    return value


def _positive(reader, key: str, default: float) -> float:
    value = _typed(reader, key, int | float, "a number", default)
    if not math.isfinite(value) or value <= 0:
        raise KolibriError(f"GGUF metadata {key} must be a finite number > 0, got {value!r}")
    return float(value)


def _strings(reader, key: str) -> list[str]:
    value = _typed(reader, key, list, "a list of strings")
    if value is None or not all(isinstance(v, str) for v in value):
        raise KolibriError(f"GGUF metadata lacks {key} (a list of strings)")
    return value


def _token_id(reader, key: str, n_tokens: int) -> int | None:
    """A special token's id, which must name a token of the vocabulary."""
    value = _typed(reader, key, int, "a token id")
    if value is not None and not 0 <= value < n_tokens:
        raise KolibriError(f"GGUF metadata {key} = {value} is outside the vocabulary "
                           f"(0..{n_tokens - 1})")
    return value


def gguf_architecture(reader) -> str:
    arch = _field(reader, "general.architecture")
    if not isinstance(arch, str) or arch not in ARCHITECTURES:
        raise KolibriError(f"GGUF architecture {shown(arch)} is not supported "
                           f"(kolibri reads {', '.join(ARCHITECTURES)})")
    return arch


def read_config(reader) -> dict:
    """The HF config.json of the GGUF; every value read is type- and range-checked."""
    arch = gguf_architecture(reader)
    whole = lambda key, default=None: _whole(reader, f"{arch}.{key}", default)  # noqa: E731
    n_head, hidden = whole("attention.head_count"), whole("embedding_length")
    names = {t.name for t in reader.tensors}
    tokens = _strings(reader, "tokenizer.ggml.tokens")
    if not tokens:
        raise KolibriError("GGUF metadata tokenizer.ggml.tokens is empty (no vocabulary)")
    head_dim = whole("attention.key_length", max(hidden // n_head, 1))
    if whole("rope.dimension_count", head_dim) != head_dim:
        raise KolibriError(f"GGUF {arch}.rope.dimension_count differs from the head size "
                           f"{head_dim} (partial RoPE is not supported)")
    eps = _positive(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    hf_arch, model_type = ARCHITECTURES[arch]
    config = {
        "architectures": [hf_arch],
        "model_type": model_type,
        "vocab_size": whole("vocab_size", len(tokens)),
        "hidden_size": hidden,
        "intermediate_size": whole("feed_forward_length"),
        "num_hidden_layers": whole("block_count"),
        "num_attention_heads": n_head,
        "num_key_value_heads": whole("attention.head_count_kv", n_head),
        "head_dim": head_dim,
        "rope_theta": _positive(reader, f"{arch}.rope.freq_base", 10000.0),
        "rms_norm_eps": float(f"{eps:.7g}"),  # the GGUF's float32 -> 1e-05
        "max_position_embeddings": whole("context_length", 2048),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": _token_id(reader, "tokenizer.ggml.bos_token_id", len(tokens)),
        "eos_token_id": _token_id(reader, "tokenizer.ggml.eos_token_id", len(tokens)),
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }
    rope = _rope_scaling(reader, arch, config)
    if rope:
        config["rope_scaling"] = rope
    return config


def check_loadable(reader, config: dict) -> None:
    """Refuse now what loading the converted folder would refuse: the config, and every
    tensor's name and shape against it (so an import never writes a model that cannot load)."""
    from kolibri_cli.engine.config import ModelConfig
    from kolibri_cli.engine.loader import check_shapes

    model_config = ModelConfig.from_dict(config)
    shapes = {hf_name(t.name): tuple(int(n) for n in reversed(t.shape))
              for t in reader.tensors if t.name not in SKIPPED}
    check_shapes(shapes, model_config.weight_shapes(), "the GGUF")


def _rope_scaling(reader, arch: str, config: dict) -> dict | None:
    """The HF rope_scaling dict for the GGUF's `{arch}.rope.scaling.*` keys or `rope_freqs`."""
    kind = _typed(reader, f"{arch}.rope.scaling.type", str, "a string", "none")
    factor = _typed(reader, f"{arch}.rope.scaling.factor", int | float, "a number")
    if factor is not None and not (math.isfinite(factor) and factor > 0):
        raise KolibriError(f"GGUF {arch}.rope.scaling.factor must be a finite number > 0, "
                           f"got {factor!r}")
    original = _typed(reader, f"{arch}.rope.scaling.original_context_length", int,
                      "a whole number")
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
    raise KolibriError(f"GGUF rope scaling {shown(kind)} is not supported (kolibri: linear, "
                       "yarn, Llama 3 rope_freqs)")


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


def storage_bytes(reader) -> int:
    """Bytes the model takes in kernel storage (the weights in memory; on disk for an import)."""
    return sum(_entry(t, 0).nbytes for t in _weight_tensors(reader))


def _weight_tensors(reader) -> list:
    return [t for t in reader.tensors if t.name not in SKIPPED]


def _entry(t, heads: int):
    """The index entry of GGUF tensor t (to be stored in blocks.bin): its own block type where
    the kernel reads it, float32 rows otherwise (the types only gguf can decode)."""
    from kolibri_cli.engine import blockfile, blocks

    name, dims = hf_name(t.name), [int(n) for n in reversed(t.shape)]  # numpy order
    if len(dims) == 1:
        return blockfile.Entry(name, None, (dims[0],))
    rows, k = int(np.prod(dims[:-1])), dims[-1]
    code = int(t.tensor_type) if int(t.tensor_type) in blocks.TYPES else blocks.F32
    return blockfile.Entry(name, code, (rows, k), heads=heads)


def _in_place(t, entry) -> bool:
    """Whether the kernel reads tensor t in the GGUF as it is: a float32 vector, or rows of a
    block type it decodes, float rows only when a multiple of 32 weights wide (unpadded)."""
    from kolibri_cli.engine import blocks

    if entry.code is None:
        return int(t.tensor_type) == blocks.F32
    if entry.code != int(t.tensor_type):
        return False
    return entry.code not in (blocks.F32, blocks.F16, blocks.BF16) or entry.shape[1] % 32 == 0


def _placed(t, config: dict, kept: str | None):
    """(index entry, whether it must be converted): in the GGUF named `kept` in the model
    folder when the kernel reads it there, else to be stored in blocks.bin."""
    import dataclasses

    entry = _entry(t, _permuted_heads(hf_name(t.name), config))
    if kept and _in_place(t, entry):
        return dataclasses.replace(entry, file=kept, offset=int(t.data_offset)), False
    return entry, True


def _storage(t, entry) -> np.ndarray:
    """Tensor t as blocks.bin stores it: its own blocks (rows in the GGUF's order), padded float
    rows, or float32 rows decoded by gguf."""
    from kolibri_cli.engine import blocks

    if entry.code is None:
        return _dequantize(t).reshape(-1)
    rows, k = entry.shape
    raw = np.asarray(t.data)
    if entry.code == blocks.F16:
        return blocks.float_rows(blocks.F16, raw.view(np.float16).reshape(rows, k))
    if entry.code == blocks.BF16:
        return blocks.float_rows(blocks.BF16, raw.view(np.uint16).reshape(rows, k))
    if entry.code == blocks.F32:
        return blocks.float_rows(blocks.F32, _dequantize(t).reshape(rows, k))
    return raw.view(np.uint8).reshape(rows, -1)


def _permuted_heads(name: str, config: dict) -> int:
    """Heads of a llama Q/K matrix (stored in llama.cpp's interleaved-RoPE row order), else 0."""
    if config["model_type"] != "llama":
        return 0
    if name.endswith("q_proj.weight"):
        return config["num_attention_heads"]
    return config["num_key_value_heads"] if name.endswith("k_proj.weight") else 0




def build_tokenizer(reader):
    """A `tokenizers` byte-level BPE equal to llama.cpp's tokenization of this GGUF."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers as pre_tok

    model = _field(reader, "tokenizer.ggml.model")
    pre = _typed(reader, "tokenizer.ggml.pre", str, "a string", "default")
    if model != "gpt2":
        raise KolibriError(
            f"GGUF tokenizer model {shown(model)} is not supported (kolibri reads 'gpt2')"
        )
    if pre not in PRETOKENIZERS:
        raise KolibriError(
            f"GGUF pre-tokenizer {shown(pre)} is not supported ({', '.join(PRETOKENIZERS)})"
        )
    tokens, types, merges = _vocabulary(reader)
    try:
        tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    except Exception as e:  # tokenizers raises a bare Exception (a merge of unknown tokens)
        raise KolibriError(f"GGUF tokenizer cannot be built ({e})") from None
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
    _add_token_types(tok, tokens, types)
    _add_bos(tok, reader, tokens)
    return tok


def _vocabulary(reader) -> tuple[list[str], list[int], list[tuple[str, str]]]:
    """(tokens, token types, merges), each checked: a type per token, merges as "a b" pairs."""
    tokens = _strings(reader, "tokenizer.ggml.tokens")
    types = _typed(reader, "tokenizer.ggml.token_type", list, "a list of token types")
    if types is None or len(types) != len(tokens) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in types):
        got = "none" if types is None else f"{len(types)}"
        raise KolibriError(f"GGUF metadata tokenizer.ggml.token_type must give one whole-number "
                           f"type per token ({len(tokens)} tokens, {got} types)")
    if "tokenizer.ggml.merges" not in reader.fields:
        raise KolibriError("GGUF metadata lacks tokenizer.ggml.merges (a gpt2 BPE needs them)")
    merges = [tuple(m.split(" ", 1)) for m in _strings(reader, "tokenizer.ggml.merges")]
    bad = next((m for m in merges if len(m) != 2 or not all(m)), None)
    if bad is not None:
        raise KolibriError(f"GGUF metadata tokenizer.ggml.merges holds {shown(' '.join(bad))}, "
                           "not two tokens separated by a space")
    return tokens, types, merges


def _add_token_types(tok, tokens: list[str], types: list[int]) -> None:
    """Token types: 3 control (special), 4 user-defined (added, matched whole, not special)."""
    from tokenizers import AddedToken

    control = [t for t, ty in zip(tokens, types, strict=True) if ty == 3]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    user = [t for t, ty in zip(tokens, types, strict=True) if ty == 4]
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])


def _add_bos(tok, reader, tokens) -> None:
    """A GGUF that asks for BOS (Llama 3) gets it from the tokenizer, as HF's tokenizer.json."""
    from tokenizers import processors

    bos = _token_id(reader, "tokenizer.ggml.bos_token_id", len(tokens))
    if not _field(reader, "tokenizer.ggml.add_bos_token", False) or bos is None:
        return
    name = tokens[bos]
    try:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{name}:0 $A:0", pair=f"{name}:0 $A:0 {name}:1 $B:1",
            special_tokens=[(name, bos)])
    except Exception as e:  # a token text the template syntax cannot hold (spaces, ':')
        raise KolibriError(f"GGUF bos token {shown(name)} cannot be added ({e})") from None


def tokenizer_config(reader) -> dict:
    tokens = _strings(reader, "tokenizer.ggml.tokens")

    def name(key: str) -> str | None:
        i = _token_id(reader, key, len(tokens))
        return None if i is None else tokens[i]

    cfg = {
        "bos_token": name("tokenizer.ggml.bos_token_id"),
        "eos_token": name("tokenizer.ggml.eos_token_id"),
        "unk_token": name("tokenizer.ggml.unknown_token_id"),
        "pad_token": name("tokenizer.ggml.padding_token_id"),
        "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        "clean_up_tokenization_spaces": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    template = _typed(reader, "tokenizer.chat_template", str, "a string")
    if template:
        cfg["chat_template"] = template
    return cfg


def convert(gguf_path: Path, out_dir: Path, progress: Ticks | None = None) -> None:
    """Write the model folder for `gguf_path` into `out_dir` (which must exist): config,
    tokenizer, and the weights' index (`engine.blockfile`). A GGUF inside `out_dir` is the
    weights' data file, read in place; of any other, every tensor is stored in blocks.bin."""
    import gguf

    from kolibri_cli.engine import blockfile

    reader = gguf.GGUFReader(str(gguf_path))
    config = read_config(reader)
    check_loadable(reader, config)
    check_tensor_types(reader)
    tokenizer = build_tokenizer(reader)  # refuses an unknown tokenizer before the slow part
    kept = gguf_path.name if gguf_path.resolve().parent == out_dir.resolve() else None
    tensors = _weight_tensors(reader)
    placed = [_placed(t, config, kept) for t in tensors]

    def arrays():
        for i, (t, (e, converted)) in enumerate(zip(tensors, placed, strict=True)):
            yield _storage(t, e) if converted else None
            if progress:
                progress(i + 1, len(tensors))

    blockfile.write(out_dir, [e for e, _ in placed], arrays())
    tokenizer.save(str(out_dir / "tokenizer.json"))
    write = lambda name, obj: (out_dir / name).write_text(json.dumps(obj, indent=2) + "\n")  # noqa: E731
    write("config.json", config)
    write("tokenizer_config.json", tokenizer_config(reader))
    gen = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
    write("generation_config.json", gen)
