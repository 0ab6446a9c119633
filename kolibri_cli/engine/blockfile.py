"""The weights of a cached model, stored once: an index (`weights.json`) that locates every
tensor's rows in the folder's data files, memory-mapped at load so the kernel reads the pages in
place. A pulled model's data file is its GGUF itself (the blocks as llama.cpp reads them too);
what the kernel cannot read in a GGUF (types only `gguf` decodes, float rows not a multiple of
32 weights wide, non-float32 vectors) is converted at import into `blocks.bin`, as is every
tensor of an imported GGUF (whose file stays where the user keeps it).

Index: {"format": FORMAT, "tensors": {hf_name: {"file", "offset", "type", "shape", "heads"}}}:
`file` a file name in the folder, `offset` the byte of the tensor's first row, `type` a
`blocks.TYPES` name (vectors: "F32"), `shape` [rows, weights per row] or [n], `heads` > 0 when
the rows are in llama.cpp's interleaved-RoPE order for that many heads (the loader addresses
them in Hugging Face order; nothing is moved). Written once at import, never modified.
`model.kolibri` (LEGACY: one file, the blocks with float32 scales) is read only to migrate it.
Non-goal: being loadable by other tools as a model.
"""

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kolibri_cli.engine import blocks
from kolibri_cli.engine.config import ModelConfig
from kolibri_cli.engine.loader import read_json_header
from kolibri_cli.engine.weights import LayerWeights, Matrix, Rows, Weights
from kolibri_cli.errors import KolibriError
from kolibri_cli.text import printable

NAME = "weights.json"
CONVERTED = "blocks.bin"
FORMAT = "kolibri-weights-2"
LEGACY = "model.kolibri"
LEGACY_FORMAT = "kolibri-blocks-1"
ALIGN = 64  # bytes: each tensor of blocks.bin starts at a multiple


@dataclass(frozen=True)
class Entry:
    """One tensor: a matrix (block type, [rows, k]) or a float32 vector, and where it is."""

    name: str  # Hugging Face name
    code: int | None  # blocks.TYPES key; None for a float32 vector
    shape: tuple[int, ...]  # logical: (rows, weights per row) or (n,)
    file: str = CONVERTED  # in the model folder
    offset: int = 0  # byte of the first row in `file`
    heads: int = 0  # > 0: rows in llama.cpp's interleaved-RoPE order for this many heads

    @property
    def nbytes(self) -> int:
        if self.code is None:
            return 4 * self.shape[0]
        return self.shape[0] * self.row_bytes

    @property
    def row_bytes(self) -> int:
        return blocks.TYPES[self.code].row_bytes(self.shape[1])

    def to_json(self) -> dict:
        return {"file": self.file, "offset": self.offset,
                "type": "F32" if self.code is None else blocks.TYPES[self.code].name,
                "shape": list(self.shape), "heads": self.heads}


def write(folder: Path, entries: list[Entry], arrays: Iterable[np.ndarray | None]) -> None:
    """Write the index of `entries` into `folder`; an entry whose array is None is read in place
    (its file and offset as given), the others' storage arrays, given in the same order, are
    appended to blocks.bin (streamed: a 5 GB model never sits in memory twice)."""
    placed, f = [], None
    try:
        for e, a in zip(entries, arrays, strict=True):
            if a is None:
                placed.append(e)
                continue
            f = f or open(folder / CONVERTED, "wb")
            raw = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
            if raw.nbytes != e.nbytes:
                raise ValueError(f"{e.name}: {raw.nbytes} bytes of storage, expected {e.nbytes}")
            f.write(b"\0" * (-f.tell() % ALIGN))
            placed.append(Entry(e.name, e.code, e.shape, CONVERTED, f.tell(), e.heads))
            raw.tofile(f)
    finally:
        if f:
            f.close()
    doc = {"format": FORMAT, "tensors": {e.name: e.to_json() for e in placed}}
    (folder / NAME).write_text(json.dumps(doc, indent=1) + "\n")


def read_index(path: Path) -> dict[str, Entry]:
    """The entries of the index at `path`, each checked to lie inside its data file (the kernel
    reads without bounds checks): a damaged index is one error line, never a wild read."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        raise KolibriError(f"{path}: not a kolibri weight index (unreadable)") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else None
        raise KolibriError(f"{path}: weight format {printable(str(got), 40)!r}, this kolibri "
                           f"reads {FORMAT}; re-import the model (kolibri model pull / import "
                           "--force)")
    tensors = doc.get("tensors")
    if not isinstance(tensors, dict):
        raise KolibriError(f"{path}: not a kolibri weight index (no tensors)")
    sizes: dict[str, int] = {}
    return {name: _entry(path, name, info, sizes) for name, info in tensors.items()}


def _count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _entry(path: Path, name: str, info, sizes: dict[str, int]) -> Entry:
    bad = KolibriError(f"{path}: tensor {printable(name)} has a malformed entry")
    if not isinstance(info, dict):
        raise bad
    file, offset, kind = info.get("file"), info.get("offset"), info.get("type")
    shape, heads = info.get("shape"), info.get("heads", 0)
    if (not isinstance(file, str) or file in ("", ".", "..") or "/" in file or "\\" in file
            or "\0" in file or not _count(offset) or not _count(heads)
            or not isinstance(shape, list) or not all(map(_count, shape))):
        raise bad
    if kind == "F32" and len(shape) == 1:
        code = None
    elif kind in blocks.BY_NAME and len(shape) == 2 and blocks.BY_NAME[kind].code < 100:
        code = blocks.BY_NAME[kind].code
    else:
        raise bad
    if heads and (code is None or shape[0] % heads or shape[0] // heads % 2):
        raise bad
    e = Entry(name, code, tuple(shape), file, offset, heads)
    if file not in sizes:
        try:
            sizes[file] = (path.parent / file).stat().st_size
        except OSError:
            raise KolibriError(f"{path}: data file {printable(file)} is missing") from None
    if e.offset + e.nbytes > sizes[file]:
        raise KolibriError(f"{path}: tensor {printable(name)} runs past the end of {file} "
                           f"({e.offset + e.nbytes} > {sizes[file]} bytes)")
    return e


def data_files(path: Path) -> list[Path]:
    """The data files the index at `path` reads, in index order."""
    files = dict.fromkeys(e.file for e in read_index(path).values())
    return [path.parent / f for f in files]


def storage(path: Path) -> tuple[dict[str, int], dict[str, int]]:
    """(block type name -> tensors, tensor name -> storage bytes), from the index alone."""
    entries = read_index(path)
    types: dict[str, int] = {}
    for e in entries.values():
        t = "F32" if e.code is None else blocks.TYPES[e.code].name
        types[t] = types.get(t, 0) + 1
    return dict(sorted(types.items())), {n: e.nbytes for n, e in entries.items()}


class _Mapped:
    """The folder's data files, each memory-mapped once (copy-on-write: the array type is a
    writable one, as the kernel is compiled for; pages stay shared until written)."""

    def __init__(self, folder: Path):
        self.folder, self.maps = folder, {}

    def __getitem__(self, file: str) -> np.ndarray:
        if file not in self.maps:
            self.maps[file] = np.memmap(self.folder / file, dtype=np.uint8, mode="c")
        return self.maps[file]


def hf_row_order(n_rows: int, heads: int) -> np.ndarray:
    """Stored row of each Hugging Face row of a llama Q/K matrix kept in llama.cpp's order
    (undoes its interleaved-RoPE permutation; identity for heads = 0)."""
    if not heads:
        return np.arange(n_rows, dtype=np.int64)
    half = n_rows // heads // 2
    return np.arange(n_rows, dtype=np.int64).reshape(heads, half, 2).swapaxes(1, 2).reshape(-1)


def _rows(e: Entry) -> Rows:
    return Rows(e.code, e.offset + e.row_bytes * hf_row_order(e.shape[0], e.heads), e.shape[1])


def _matrix(mapped: _Mapped, parts: list[Entry]) -> Matrix:
    """The matrix of `parts` stacked: addresses into their file, or (parts in different files)
    a copy of their rows in one buffer."""
    if len({e.file for e in parts}) == 1:
        return Matrix.of_rows(mapped[parts[0].file], [_rows(e) for e in parts])
    return _copied(mapped, parts)


def _copy_rows(mapped: _Mapped, e: Entry) -> np.ndarray:
    """[rows, row bytes] of e, in Hugging Face row order (a copy)."""
    at = _rows(e).at
    return mapped[e.file][at[:, None] + np.arange(e.row_bytes)]


def _copied(mapped: _Mapped, parts: list[Entry]) -> Matrix:
    """Parts in several files: their rows copied into one buffer, each part keeping its type."""
    data = np.concatenate([_copy_rows(mapped, e).reshape(-1) for e in parts])
    rows, offset = [], 0
    for e in parts:
        rows.append(Rows(e.code, offset + e.row_bytes * np.arange(e.shape[0], dtype=np.int64),
                         e.shape[1]))
        offset += e.nbytes
    return Matrix.of_rows(data, rows)


def _vector(mapped: _Mapped, e: Entry) -> np.ndarray:
    return mapped[e.file][e.offset:e.offset + e.nbytes].view(np.float32).copy()


def load_weights(path: Path, config: ModelConfig) -> Weights:
    """The weights the index at `path` locates, memory-mapped (pages are read on first use)."""
    entries = read_index(path)
    _check_names(path, entries, config)
    mapped = _Mapped(path.parent)

    def matrix(*names: str) -> Matrix:
        return _matrix(mapped, [entries[n] for n in names])

    return _weights(config, matrix, lambda name: _vector(mapped, entries[name]))


def float_tensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor decoded to float32 [rows, k] / [n] in Hugging Face order (what gguf's
    dequantize gives), for the transformers reference engine."""
    mapped, out = _Mapped(path.parent), {}
    for name, e in read_index(path).items():
        out[name] = _vector(mapped, e) if e.code is None else _matrix(mapped, [e]).to_float32()
    return out


def _check_names(path: Path, entries: dict[str, Entry], config: ModelConfig) -> None:
    for name, shape in config.weight_shapes().items():
        if name not in entries:
            raise KolibriError(f"{path}: missing tensor {name}")
        if entries[name].shape != shape:
            raise KolibriError(f"{path}: tensor {name} has shape {entries[name].shape}, config "
                               f"expects {shape}")
        if len(shape) == 2 and entries[name].code is None:
            raise KolibriError(f"{path}: tensor {name} is a matrix stored as a vector")


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


# ---------------------------------------------------------------- the legacy single file


def legacy_tensors(path: Path) -> tuple[list[Entry], Iterable[np.ndarray]]:
    """(entries, their storage arrays) of a `model.kolibri`, the 32-weight types' float32
    scales narrowed back to the GGUF's float16 (exact: they were widened from it)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        header, base = read_json_header(f, path, size, "weight file", "a kolibri weight file")
    meta = header.pop("__metadata__", None)
    if not isinstance(meta, dict) or meta.get("format") != LEGACY_FORMAT:
        raise KolibriError(f"{path}: not a kolibri weight file of format {LEGACY_FORMAT}")
    types, shapes = json.loads(meta["types"]), json.loads(meta["shapes"])
    entries = [Entry(name, None if name not in types else blocks.BY_NAME[types[name]].code,
                     tuple(shapes.get(name, info["shape"]))) for name, info in header.items()]
    data = np.memmap(path, dtype=np.uint8, mode="r")

    def arrays():
        for e in entries:
            start, stop = (base + o for o in header[e.name]["data_offsets"])
            if stop > size:
                raise KolibriError(f"{path}: truncated weight file")
            raw = data[start:stop]
            yield raw if e.code is None else blocks.narrow_scales(e.code, raw.reshape(
                e.shape[0], -1))

    return entries, arrays()
