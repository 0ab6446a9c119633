"""Read a Hugging Face-layout folder: config.json, (sharded) safetensors, checked against config.

safetensors is parsed here (header + memory map) rather than through `safetensors.numpy`, because
numpy has no bfloat16: bf16 tensors are widened to float32 bit-exactly (bf16 is the top half of an
f32). Every tensor's name and shape is checked against `ModelConfig.weight_shapes()`.
Non-goals: quantized or integer tensors, pickled `.bin` checkpoints.
"""

import hashlib
import json
import struct
from math import prod
from pathlib import Path

import numpy as np

from kolibri_cli.engine.config import ModelConfig
from kolibri_cli.errors import KolibriError
from kolibri_cli.text import printable, shown

_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}
IGNORED = ("rotary_emb.inv_freq",)  # buffers some checkpoints carry; recomputed from config


def check_folder(path: Path) -> Path:
    path = Path(path)
    if not path.exists():
        raise KolibriError(f"model folder {path} does not exist")
    if not path.is_dir():
        raise KolibriError(f"{path} is not a folder (expected a Hugging Face model folder)")
    for name in ("config.json", "tokenizer.json"):
        if not (path / name).is_file():
            raise KolibriError(
                f"{path} has no {name} — not a Hugging Face model folder kolibri can load"
            )
    return path


def safetensors_files(path: Path) -> list[Path]:
    """The weight files: the shards an index names, else every *.safetensors in the folder.
    Only regular files inside the folder: an index naming ../x or /etc/x, or a FIFO (a read
    that never ends), is refused."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = [path / s for s in _index_shards(index)]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise KolibriError(f"{path}: shard {printable(missing[0])} named in the index is "
                               "missing")
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise KolibriError(f"{path} has no *.safetensors weights (kolibri does not read .bin)")
    odd = next((f for f in files if not f.is_file()), None)
    if odd is not None:
        raise KolibriError(f"{odd}: not a regular file")
    return files


def _index_shards(index: Path) -> list[str]:
    try:
        shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
    except (OSError, ValueError, RecursionError, KeyError, TypeError, AttributeError):
        raise KolibriError(f"{index}: not a safetensors index (no weight_map)") from None
    bad = next((s for s in shards if not isinstance(s, str) or s in ("", ".", "..")
                or "/" in s or "\\" in s or "\0" in s), None)
    if bad is not None:
        raise KolibriError(f"{index}: shard {shown(bad)} is not a file name in the folder")
    return sorted(shards)


MAX_HEADER = 100_000_000  # bytes; the safetensors library's own limit


def read_json_header(f, path: Path, size: int, kind: str, a_kind: str) -> tuple[dict, int]:
    """(the JSON object, offset after it) of a file that starts with an 8-byte little-endian
    length and that many bytes of JSON (safetensors, and kolibri's block file after it);
    `kind` / `a_kind` name the file in errors ("safetensors file" / "a safetensors file")."""
    raw = f.read(8)
    if len(raw) < 8:
        raise KolibriError(f"{path}: truncated {kind} (no header)")
    (n,) = struct.unpack("<Q", raw)
    if n > size - 8:
        raise KolibriError(f"{path}: truncated {kind} (header runs past the end)")
    if n > MAX_HEADER:
        raise KolibriError(f"{path}: not {a_kind} (a {n}-byte header)")
    try:
        header = json.loads(f.read(n))
    except (ValueError, RecursionError):  # bad JSON or UTF-8, an int of 4300+ digits, nesting
        raise KolibriError(f"{path}: not {a_kind} (unreadable header)") from None
    if not isinstance(header, dict):
        raise KolibriError(f"{path}: not {a_kind} (header is not a JSON object)")
    return header, 8 + n


def _header(f, path: Path, size: int) -> tuple[dict, int]:
    """(name -> {dtype, shape, data_offsets}, offset of the data section), validated."""
    header, base = read_json_header(f, path, size, "safetensors file", "a safetensors file")
    header.pop("__metadata__", None)
    for name, info in header.items():
        _check_entry(path, name, info)
    return header, base


def _is_count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _check_entry(path: Path, name: str, info) -> None:
    """dtype one we read, shape a list of counts, data_offsets [start, stop] of exactly its
    bytes: anything else (floats, strings, negatives, absurd sizes) is one error naming it."""
    name = printable(name)
    try:
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    except (KeyError, TypeError):
        raise KolibriError(f"{path}: tensor {name} has a malformed header entry") from None
    if not isinstance(dtype, str) or dtype not in _DTYPES:
        dtype = printable(str(dtype), 20)
        raise KolibriError(f"{path}: tensor {name} has dtype {dtype}; kolibri reads F32/F16/BF16")
    if not isinstance(shape, list) or len(shape) > 8 or not all(map(_is_count, shape)):
        raise KolibriError(f"{path}: tensor {name} has an invalid shape (a list of at most 8 "
                           "whole numbers >= 0)")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_is_count, offsets))
            or offsets[0] > offsets[1]):
        raise KolibriError(f"{path}: tensor {name} has invalid data_offsets (want [start, stop], "
                           "0 <= start <= stop)")
    start, stop = offsets
    if stop - start != prod(shape) * np.dtype(_DTYPES[dtype]).itemsize:
        raise KolibriError(
            f"{path}: tensor {name}: {stop - start} bytes of data do not fit {dtype} {shape}"
        )


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """All tensors of one file as float32 arrays (f16/bf16 widened; f32 memory-mapped)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        header, base = _header(f, path, size)
    end = max((info["data_offsets"][1] for info in header.values()), default=0)
    if base + end > size:
        raise KolibriError(f"{path}: truncated safetensors file ({size} of {base + end} bytes)")
    if not header:
        return {}
    data = np.memmap(path, dtype=np.uint8, mode="r")
    return {name: _tensor(data, base, info) for name, info in header.items()}


def _tensor(data: np.ndarray, base: int, info: dict) -> np.ndarray:
    start, stop = info["data_offsets"]
    a = data[base + start : base + stop].view(_DTYPES[info["dtype"]]).reshape(info["shape"])
    if info["dtype"] == "BF16":
        return (a.astype(np.uint32) << 16).view(np.float32)  # bf16 = the high 16 bits of an f32
    return a.astype(np.float32, copy=False)


def load_tensors(path: Path, config: ModelConfig) -> dict[str, np.ndarray]:
    tensors: dict[str, np.ndarray] = {}
    for f in safetensors_files(path):
        part = read_safetensors(f)
        if twice := sorted(set(part) & set(tensors)):
            raise KolibriError(f"{path}: tensor {twice[0]} appears in more than one file")
        tensors |= part
    tensors = {k: v for k, v in tensors.items() if not k.endswith(IGNORED)}
    if config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    check_tensors(tensors, config.weight_shapes(), path)
    return tensors


def check_tensors(tensors: dict, expected: dict[str, tuple[int, ...]], path: Path) -> None:
    check_shapes({name: t.shape for name, t in tensors.items()}, expected, path)


def check_shapes(found: dict[str, tuple], expected: dict[str, tuple[int, ...]], where) -> None:
    """Every expected tensor present with its shape, nothing else (names as the config implies)."""
    missing = [n for n in expected if n not in found]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise KolibriError(f"{where}: missing tensors {', '.join(missing[:3])}{more}")
    for name, shape in expected.items():
        if tuple(found[name]) != shape:
            got = tuple(found[name])
            raise KolibriError(f"{where}: tensor {name} has shape {got}, config expects {shape}")
    extra = sorted(set(found) - set(expected))
    if extra:
        names = ", ".join(printable(n) for n in extra[:3])
        raise KolibriError(f"{where}: unexpected tensors {names} (architecture mismatch?)")


def tensor_index(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (dtype, shape) from the safetensors headers only (no weights read)."""
    index = {}
    for f in safetensors_files(path):
        with open(f, "rb") as fh:
            header, _ = _header(fh, f, f.stat().st_size)
        index |= {name: (info["dtype"], tuple(info["shape"])) for name, info in header.items()}
    return index


def sha256_files(paths: list[Path], chunk: int = 1 << 22) -> str:
    """One sha256 over the files' bytes, in order (a model's identity)."""
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            while block := f.read(chunk):
                h.update(block)
    return h.hexdigest()
