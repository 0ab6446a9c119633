"""The model cache's weight file: every tensor in kernel storage (GGUF blocks or float rows, see
`blocks`), memory-mapped at load so the kernel reads the file's pages in place.

Format: a safetensors container (8-byte little-endian header length, JSON header, data) holding
each matrix as U8 [rows, row bytes] and each vector as F32 [n], under Hugging Face names and in
Hugging Face row order. `__metadata__` carries `format`, and for every matrix its block type and
logical shape [rows, weights per row]. Written once at import, never modified.
Non-goal: being loadable by other tools as a model (the safetensors library can list it).
"""

import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kolibri_cli.engine import blocks
from kolibri_cli.engine.config import ModelConfig
from kolibri_cli.engine.loader import read_json_header
from kolibri_cli.engine.weights import LayerWeights, Matrix, Rows, Weights
from kolibri_cli.errors import KolibriError

NAME = "model.kolibri"
FORMAT = "kolibri-blocks-1"


@dataclass(frozen=True)
class Entry:
    """One tensor of a block file: a matrix (block type, [rows, k]) or a float32 vector."""

    name: str  # Hugging Face name
    code: int | None  # blocks.TYPES key; None for a float32 vector
    shape: tuple[int, ...]  # logical: (rows, weights per row) or (n,)

    @property
    def nbytes(self) -> int:
        if self.code is None:
            return 4 * self.shape[0]
        return self.shape[0] * blocks.TYPES[self.code].row_bytes(self.shape[1])


def write(path: Path, entries: list[Entry], arrays: Iterable[np.ndarray]) -> None:
    """Write the tensors `entries` announces, their storage arrays given in the same order
    (streamed: a 5 GB model never sits in memory twice)."""
    header, offset = {}, 0
    for e in entries:
        shape = list(e.shape) if e.code is None else [e.shape[0], e.nbytes // e.shape[0]]
        header[e.name] = {"dtype": "F32" if e.code is None else "U8", "shape": shape,
                          "data_offsets": [offset, offset + e.nbytes]}
        offset += e.nbytes
    matrices = [e for e in entries if e.code is not None]
    meta = {"format": FORMAT,
            "types": json.dumps({e.name: blocks.TYPES[e.code].name for e in matrices}),
            "shapes": json.dumps({e.name: list(e.shape) for e in matrices})}
    text = json.dumps({"__metadata__": meta, **header}).encode()
    text += b" " * (-len(text) % 8)  # data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for e, a in zip(entries, arrays, strict=True):
            raw = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
            if raw.nbytes != e.nbytes:
                raise ValueError(f"{e.name}: {raw.nbytes} bytes of storage, expected {e.nbytes}")
            raw.tofile(f)


def read_header(path: Path) -> tuple[dict, dict, int]:
    """(tensors: name -> header entry, metadata, data offset) of a block file, validated."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        header, base = read_json_header(f, path, size, "weight file", "a kolibri weight file")
    meta = header.pop("__metadata__", None)
    if not isinstance(meta, dict):
        raise KolibriError(f"{path}: not a kolibri weight file (unreadable header)")
    if meta.get("format") != FORMAT:
        raise KolibriError(f"{path}: weight format {meta.get('format')!r}, this kolibri reads "
                           f"{FORMAT}; re-import the model (kolibri model pull / import --force)")
    end = max((e["data_offsets"][1] for e in header.values()), default=0)
    if base + end > size:
        raise KolibriError(f"{path}: truncated weight file ({size} of {base + end} bytes)")
    meta = {"types": json.loads(meta["types"]), "shapes": json.loads(meta["shapes"])}
    return header, meta, base


def storage(path: Path) -> tuple[dict[str, int], dict[str, int]]:
    """(block type name -> tensors, tensor name -> storage bytes), from the header alone."""
    header, meta, _ = read_header(path)
    types: dict[str, int] = {}
    for name in header:
        t = meta["types"].get(name, "F32")
        types[t] = types.get(t, 0) + 1
    sizes = {n: e["data_offsets"][1] - e["data_offsets"][0] for n, e in header.items()}
    return dict(sorted(types.items())), sizes


def float_tensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor decoded to float32 [rows, k] / [n] (what gguf's dequantize gives), for the
    transformers reference engine."""
    from kolibri_cli.engine.matmul import decode_rows

    header, meta, base = read_header(path)
    data = np.memmap(path, dtype=np.uint8, mode="c")
    out = {}
    for name, e in header.items():
        start = base + e["data_offsets"][0]
        if name not in meta["types"]:
            out[name] = data[start:start + 4 * e["shape"][0]].view(np.float32).copy()
            continue
        (n, k), row_bytes = meta["shapes"][name], e["shape"][1]
        code, kp = blocks.BY_NAME[meta["types"][name]].code, -(-k // 32) * 32
        rows = np.empty((n, kp), np.float32)
        decode_rows(code, data, start, row_bytes, n, kp, rows)
        out[name] = np.ascontiguousarray(rows[:, :k])
    return out


def load_weights(path: Path, config: ModelConfig) -> Weights:
    """The weights of a block file, memory-mapped (pages are read on first use)."""
    header, meta, base = read_header(path)
    _check_names(path, header, meta, config)
    data = np.memmap(path, dtype=np.uint8, mode="c")  # writable type, pages shared until written

    def rows(name: str) -> Rows:
        start = base + header[name]["data_offsets"][0]
        n, k = meta["shapes"][name]
        row_bytes = header[name]["shape"][1]
        code = blocks.BY_NAME[meta["types"][name]].code
        return Rows(code, start + row_bytes * np.arange(n, dtype=np.int64), k)

    def matrix(*names: str) -> Matrix:
        return Matrix.of_rows(data, [rows(n) for n in names])

    def vector(name: str) -> np.ndarray:
        start = base + header[name]["data_offsets"][0]
        return data[start:start + 4 * header[name]["shape"][0]].view(np.float32).copy()

    return _weights(config, matrix, vector)


def _check_names(path: Path, header: dict, meta: dict, config: ModelConfig) -> None:
    expected = config.weight_shapes()
    for name, shape in expected.items():
        if name not in header:
            raise KolibriError(f"{path}: missing tensor {name}")
        got = tuple(meta["shapes"].get(name, header[name]["shape"]))
        if got != shape:
            raise KolibriError(f"{path}: tensor {name} has shape {got}, config expects {shape}")


def _weights(config: ModelConfig, matrix, vector) -> Weights:
    layers = []
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        lw = LayerWeights(
            attn_norm=vector(p + "input_layernorm.weight"),
            wqkv=matrix(*(p + f"self_attn.{x}_proj.weight" for x in "qkv")),
            wo=matrix(p + "self_attn.o_proj.weight"),
            mlp_norm=vector(p + "post_attention_layernorm.weight"),
            w_gate_up=matrix(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
            w_down=matrix(p + "mlp.down_proj.weight"),
        )
        if config.qkv_bias:
            lw.bqkv = np.concatenate([vector(p + f"self_attn.{x}_proj.bias") for x in "qkv"])
        if config.qk_norm:
            lw.q_norm = vector(p + "self_attn.q_norm.weight")
            lw.k_norm = vector(p + "self_attn.k_norm.weight")
        layers.append(lw)
    embed = matrix("model.embed_tokens.weight")
    head = embed if config.tie_word_embeddings else matrix("lm_head.weight")
    return Weights(embed=embed, layers=layers, norm=vector("model.norm.weight"), head=head)
