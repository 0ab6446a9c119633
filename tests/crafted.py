"""Files an attacker (or a broken tool) might hand kolibri, built from valid tiny ones: safetensors
written byte by byte, and GGUFs written with the `gguf` library's own writer from a table of
metadata fields the tests edit (delete a key, change a value's type or range)."""

import json
import struct
from pathlib import Path

import numpy as np

TOKEN_TYPES_CONTROL = 3
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["h e", "l l", "he ll"]
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
SIZES = dict(hidden=32, ffn=64, layers=1, heads=4, kv_heads=2, context=64)


def write_raw_safetensors(path: Path, header: dict, data: bytes = b"") -> None:
    """A safetensors file from a header dict as given (any JSON), then `data`."""
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + data)


def vocab() -> tuple[list[str], list[int]]:
    """Specials (control), the 256 byte symbols, one token per merge."""
    from tokenizers import pre_tokenizers

    tokens = SPECIALS + sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens += ["".join(m.split()) for m in MERGES]
    return tokens, [TOKEN_TYPES_CONTROL] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))


def gguf_fields() -> dict[str, tuple]:
    """key -> (GGUFValueType, value[, array item type]) of a valid tiny llama GGUF."""
    import gguf

    T = gguf.GGUFValueType
    tokens, types = vocab()
    s = SIZES
    return {
        "general.architecture": (T.STRING, "llama"),
        "llama.block_count": (T.UINT32, s["layers"]),
        "llama.context_length": (T.UINT32, s["context"]),
        "llama.embedding_length": (T.UINT32, s["hidden"]),
        "llama.feed_forward_length": (T.UINT32, s["ffn"]),
        "llama.attention.head_count": (T.UINT32, s["heads"]),
        "llama.attention.head_count_kv": (T.UINT32, s["kv_heads"]),
        "llama.rope.freq_base": (T.FLOAT32, 10000.0),
        "llama.attention.layer_norm_rms_epsilon": (T.FLOAT32, 1e-5),
        "tokenizer.ggml.model": (T.STRING, "gpt2"),
        "tokenizer.ggml.pre": (T.STRING, "smollm"),
        "tokenizer.ggml.tokens": (T.ARRAY, tokens, T.STRING),
        "tokenizer.ggml.token_type": (T.ARRAY, types, T.INT32),
        "tokenizer.ggml.merges": (T.ARRAY, MERGES, T.STRING),
        "tokenizer.ggml.bos_token_id": (T.UINT32, 1),
        "tokenizer.ggml.eos_token_id": (T.UINT32, 2),
        "tokenizer.chat_template": (T.STRING, TEMPLATE),
    }


def gguf_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array [out, in] for SIZES (untied head)."""
    s, n_vocab = SIZES, len(vocab()[0])
    dh = s["hidden"] // s["heads"]
    shapes = {"token_embd.weight": (n_vocab, s["hidden"]), "output_norm.weight": (s["hidden"],),
              "output.weight": (n_vocab, s["hidden"])}
    for i in range(s["layers"]):
        shapes |= {f"blk.{i}.attn_norm.weight": (s["hidden"],),
                   f"blk.{i}.attn_q.weight": (s["heads"] * dh, s["hidden"]),
                   f"blk.{i}.attn_k.weight": (s["kv_heads"] * dh, s["hidden"]),
                   f"blk.{i}.attn_v.weight": (s["kv_heads"] * dh, s["hidden"]),
                   f"blk.{i}.attn_output.weight": (s["hidden"], s["heads"] * dh),
                   f"blk.{i}.ffn_norm.weight": (s["hidden"],),
                   f"blk.{i}.ffn_gate.weight": (s["ffn"], s["hidden"]),
                   f"blk.{i}.ffn_up.weight": (s["ffn"], s["hidden"]),
                   f"blk.{i}.ffn_down.weight": (s["hidden"], s["ffn"])}
    rng = np.random.default_rng(seed)
    return {n: (0.1 * rng.standard_normal(shape)).astype(np.float32) for n, shape in shapes.items()}


def write_gguf(path: Path, fields: dict | None = None, tensors: dict | None = None) -> Path:
    """A GGUF with `fields` (default: gguf_fields()) and `tensors` (default: gguf_tensors())."""
    import gguf

    fields = gguf_fields() if fields is None else fields
    arch = fields.get("general.architecture", (None, "llama"))[1]
    w = gguf.GGUFWriter(str(path), arch if isinstance(arch, str) else "llama")
    w.kv_data[0].clear()  # the writer adds general.architecture itself: ours decides
    for key, (vtype, value, *sub) in fields.items():
        w.add_key_value(key, value, vtype, sub[0] if sub else None)
    for name, a in (gguf_tensors() if tensors is None else tensors).items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def golden_line(**changes) -> dict:
    """One valid golden (a chain whose repeats the probe can draft from), with `changes`."""
    return {"id": "g1", "category": "code", "prompt": "p", "chat": True,
            "prompt_ids": [1, 2, 3, 4, 5], "output_ids": [1, 2, 3, 9, 1, 2, 3, 4], "model": "m",
            "model_sha256": "0" * 64, "reference": {}} | changes


def write_goldens(path: Path, *lines: dict) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in (lines or [golden_line()])))
    return path
