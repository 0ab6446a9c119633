"""Llama-shaped GGUFs of random blocks, written with the `gguf` writer: stand-ins for real
checkpoints of a given size and quantization mix, for tests (tiny, one block type) and for
measuring load, memory and speed (Llama-3-8B shapes in llama.cpp's Q4_K_M mix). kolibri and
llama.cpp read them like any GGUF; the text they generate is noise.
"""

from pathlib import Path

import numpy as np

# float16 fields of a block (byte offset -> scale) keeping the weights finite and ~0.02
_HALVES = {"Q4_0": {0: 5e-3}, "Q4_1": {0: 3e-3, 2: -2e-2}, "Q5_0": {0: 2e-3},
           "Q5_1": {0: 1.5e-3, 2: -2e-2}, "Q8_0": {0: 3e-4}, "Q4_K": {0: 1e-4, 2: 7.5e-4},
           "Q5_K": {0: 5e-5, 2: 7.5e-4}, "Q6_K": {208: 1.5e-5}}
FLOAT = ("F32", "F16", "BF16")
TYPES = (*_HALVES, *FLOAT)


def random_rows(name: str, rows: int, k: int, rng) -> np.ndarray:
    """[rows, bytes per row] of a GGUF tensor of type `name`: random codes, random-sign scales."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    if name in FLOAT:
        w = (0.02 * rng.standard_normal((rows, k))).astype(np.float32)
        if name == "F16":
            w = w.astype(np.float16)
        elif name == "BF16":
            w = (w.view(np.uint32) >> 16).astype(np.uint16)
        return w.view(np.uint8)
    per, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[name]]
    raw = rng.integers(0, 256, (rows, k // per, nbytes), dtype=np.uint8)
    for off, scale in _HALVES[name].items():
        h = scale * rng.choice([-1.0, 1.0], raw.shape[:2]) * (0.5 + rng.random(raw.shape[:2]))
        raw[:, :, off:off + 2] = h.astype(np.float16).view(np.uint8).reshape(*raw.shape[:2], 2)
    return raw.reshape(rows, -1)


def q4_k_m(kind: str, layer: int, n_layers: int) -> str:
    """llama.cpp's Q4_K_M choice of type (llama-quant.cpp, without an importance matrix)"""
    if kind == "output":
        return "Q6_K"
    more_bits = (layer < n_layers // 8 or layer >= 7 * n_layers // 8
                 or (layer - n_layers // 8) % 3 == 2)
    return "Q6_K" if kind in ("attn_v", "ffn_down") and more_bits else "Q4_K"


def _vocab(n: int) -> tuple[list[str], list[int], list[str]]:
    """The 256 byte symbols, a few merges, filler tokens, then bos and eos (control)."""
    from tokenizers import pre_tokenizers

    merges = ["Ġ t", "Ġ a", "h e", "i n"]
    tokens = sorted(pre_tokenizers.ByteLevel.alphabet()) + ["".join(m.split()) for m in merges]
    tokens += [f"tok{i}" for i in range(n - len(tokens) - 2)] + ["<|begin|>", "<|end|>"]
    return tokens, [1] * (n - 2) + [3, 3], merges


def _matrices(n_layers: int, d: int, ff: int, kv_rows: int, vocab: int, tied: bool):
    yield "token_embd.weight", "token_embd", -1, vocab, d
    if not tied:
        yield "output.weight", "output", -1, vocab, d
    for i in range(n_layers):
        for kind, rows, cols in [("attn_q", d, d), ("attn_k", kv_rows, d), ("attn_v", kv_rows, d),
                                 ("attn_output", d, d), ("ffn_gate", ff, d), ("ffn_up", ff, d),
                                 ("ffn_down", d, ff)]:
            yield f"blk.{i}.{kind}.weight", kind, i, rows, cols


def write(path: Path, n_layers: int = 32, d: int = 4096, ff: int = 14336, heads: int = 32,
          kv_heads: int = 8, vocab: int = 128256, context: int = 8192, tied: bool = False,
          types=q4_k_m, seed: int = 0) -> None:
    """`types(kind, layer, n_layers)` names each matrix's block type; norms are F32. One tensor
    is in memory at a time (the 8B file is written in ~20 s)."""
    import gguf

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    for add, value in [(w.add_block_count, n_layers), (w.add_context_length, context),
                       (w.add_embedding_length, d), (w.add_feed_forward_length, ff),
                       (w.add_head_count, heads), (w.add_head_count_kv, kv_heads),
                       (w.add_rope_dimension_count, d // heads), (w.add_rope_freq_base, 5e5),
                       (w.add_layer_norm_rms_eps, 1e-5), (w.add_tokenizer_model, "gpt2"),
                       (w.add_tokenizer_pre, "llama-bpe"), (w.add_bos_token_id, vocab - 2),
                       (w.add_eos_token_id, vocab - 1)]:
        add(value)
    tokens, token_types, merges = _vocab(vocab)
    w.add_token_list(tokens)
    w.add_token_types(token_types)
    w.add_token_merges(merges)
    norms = ["output_norm.weight"] + [f"blk.{i}.{n}_norm.weight" for i in range(n_layers)
                                      for n in ("attn", "ffn")]
    for name in norms:
        w.add_tensor_info(name, (d,), np.dtype(np.float32), 4 * d)
    plan = []
    for name, kind, layer, rows, cols in _matrices(n_layers, d, ff, kv_heads * d // heads,
                                                   vocab, tied):
        t = types(kind, layer, n_layers)
        nbytes = random_rows(t, 1, cols, rng).nbytes
        raw = None if t in FLOAT else gguf.GGMLQuantizationType[t]
        if raw is None:
            w.add_tensor_info(name, (rows, cols), np.dtype({"F32": np.float32, "F16": np.float16,
                                                            "BF16": np.uint16}[t]), rows * nbytes,
                              raw_dtype=gguf.GGMLQuantizationType.BF16 if t == "BF16" else None)
        else:
            w.add_tensor_info(name, (rows, nbytes), np.dtype(np.uint8), rows * nbytes,
                              raw_dtype=raw)
        plan.append((t, rows, cols))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _ in norms:
        w.write_tensor_data((1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32))
    for t, rows, cols in plan:
        w.write_tensor_data(random_rows(t, rows, cols, rng))
    w.close()


def write_sparse(path: Path, tokenizer_from: Path, data_bytes: int = 40 * 10**9,
                 context: int = 131072) -> None:
    """A deployment-sized GGUF that takes no disk: the tokenizer and chat template of the GGUF
    `tokenizer_from` (its tokenizer.* metadata, as typed there), a 70B-like llama's context and
    80 layers, and Q4_0 [28672, 8192] tensor infos for at least `data_bytes`, whose data is a
    sparse hole (zeros never written): what reading a big GGUF's metadata alone is tested and
    timed on."""
    import os

    import gguf

    src = gguf.GGUFReader(str(tokenizer_from))
    w = gguf.GGUFWriter(str(path), "llama")
    for key, f in src.fields.items():
        if key.startswith("tokenizer."):
            w.add_key_value(key, f.contents(), f.types[0], f.types[1] if len(f.types) > 1 else None)
    w.add_context_length(context)
    w.add_block_count(80)
    per = 28672 * (8192 // 32 * 18)  # Q4_0: 18 bytes per block of 32 weights; 32-byte aligned
    n = data_bytes // per + 1
    for i in range(n):
        w.add_tensor_info(f"blk.{i}.ffn_up.weight", (28672, 8192 // 32 * 18),
                          np.dtype(np.uint8), per, raw_dtype=gguf.GGMLQuantizationType.Q4_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    start = (Path(path).stat().st_size + 31) // 32 * 32  # the data section is 32-byte aligned
    os.truncate(path, start + n * per)
