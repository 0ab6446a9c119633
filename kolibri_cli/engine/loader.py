"""Read a Hugging Face-layout folder: config.json, (sharded) safetensors, checked against config.

The safetensors library reads the files: `safe_open` validates each header (JSON, dtypes, shapes,
offsets that cover the data exactly) and gives every tensor's dtype and shape; F16 tensors come
through its numpy API and are widened to float32. F32 tensors are memory-mapped at the offsets
of the header it validated (the library's numpy API copies them into memory: the loader would
then hold the model twice while building the kernel's layout). BF16 is the one exception the
library cannot serve — its numpy API refuses bfloat16 ("data type 'bfloat16' not understood") —
so BF16 tensors are memory-mapped too and widened bit-exactly here (bf16 is the top half of an
f32). Every tensor's name and shape is checked against `ModelConfig.weight_shapes()`.
Non-goals: quantized or integer tensors, pickled `.bin` checkpoints.
"""

import hashlib
import json
import struct
from contextlib import contextmanager
from math import prod
from pathlib import Path

import numpy as np

from kolibri_cli.engine.config import ModelConfig
from kolibri_cli.errors import KolibriError
from kolibri_cli.text import printable, shown

_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}
INDEX = "model.safetensors.index.json"  # a sharded checkpoint's map of tensors to files
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
    index = path / INDEX
    if index.is_file():
        files = [path / s for s in _index_shards(index)]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise KolibriError(f"{path}: shard {printable(missing[0])} named in the index is "
                               "missing")
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise no_weights(path)
    odd = next((f for f in files if not f.is_file()), None)
    if odd is not None:
        raise KolibriError(f"{odd}: not a regular file")
    return files


def read_json_object(path: Path) -> dict:
    """A JSON file holding one object; anything else is one KolibriError naming the file."""
    try:
        found = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise KolibriError(f"{path}: cannot be read ({e.strerror})") from None
    except (ValueError, RecursionError) as e:  # JSON, UTF-8, 4300+ digit ints, deep nesting
        raise KolibriError(f"{path}: not valid JSON ({printable(str(e), 120)})") from None
    if not isinstance(found, dict):
        raise KolibriError(f"{path}: not a JSON object")
    return found


def no_weights(path: Path) -> KolibriError:
    """What a command that runs the model says of a folder without weights."""
    return KolibriError(f"{path} has no *.safetensors weights (kolibri does not read .bin): this "
                        "command runs the model here and needs them; a folder of tokenizer files "
                        "serves goldens import and --engine URL (docs/engines.md)")


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
    length and that many bytes of JSON, as safetensors does: kolibri's block file (a safetensors
    container the cache writes and engine/blockfile.py reads itself); `kind` / `a_kind` name the
    file in errors ("weight file" / "a kolibri weight file")."""
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


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """All tensors of one file as float32 arrays (F32 memory-mapped; F16 and BF16 widened)."""
    with _safe_open(path) as f:
        kinds = _dtypes_and_shapes(f, path)
        if not kinds:
            return {}
        offsets, base = _data_offsets(path)
        data = np.memmap(path, dtype=np.uint8, mode="r")
        return {name: f.get_tensor(name).astype(np.float32) if dtype == "F16"
                else _mapped(data, base + offsets[name][0], dtype, shape)
                for name, (dtype, shape) in kinds.items()}


@contextmanager
def _safe_open(path: Path):
    """safetensors' handle on `path` (numpy); a file it refuses is one KolibriError naming it and
    why. Opened by Python first: the library reports an unreadable file as 'No such file'."""
    from safetensors import SafetensorError, safe_open

    with open(path, "rb"):
        pass  # PermissionError and the like, as the OS says them
    try:
        with safe_open(str(path), framework="numpy") as f:
            yield f
    except SafetensorError as e:
        reason = str(e).removeprefix("Error while deserializing header: ")
        cut = next((why for text, why in _TRUNCATED.items() if text in reason), None)
        if cut is not None:
            raise KolibriError(f"{path}: truncated safetensors file ({cut})") from None
        raise KolibriError(f"{path}: not a safetensors file "
                           f"({printable(reason, 120)})") from None


_TRUNCATED = {  # safetensors' words for a cut file -> ours
    "header too small": "no header",
    "invalid header length": "the header runs past the end",
    "file not fully covered": "its tensors do not cover the file exactly: cut short, or bytes "
                              "after the last tensor",
}


def _dtypes_and_shapes(f, path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (dtype, shape) from an open safe_open handle; a dtype kolibri does not read is
    one error naming the tensor."""
    kinds = {}
    for name in f.keys():
        piece = f.get_slice(name)
        dtype = piece.get_dtype()
        if dtype not in _DTYPES:
            raise KolibriError(f"{path}: tensor {printable(name)} has dtype "
                               f"{printable(dtype, 20)}; kolibri reads F32/F16/BF16")
        kinds[name] = (dtype, tuple(piece.get_shape()))
    return kinds


def _data_offsets(path: Path) -> tuple[dict[str, list[int]], int]:
    """(name -> [start, stop] in the data section, where the data section starts), from the
    header safe_open has just validated: the library does not give them."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return {name: info["data_offsets"] for name, info in header.items()}, 8 + n


def _mapped(data: np.ndarray, start: int, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """An F32 tensor as a view of the file; a BF16 one widened to float32."""
    a = data[start : start + prod(shape) * np.dtype(_DTYPES[dtype]).itemsize]
    a = a.view(_DTYPES[dtype]).reshape(shape)
    if dtype == "BF16":
        return (a.astype(np.uint32) << 16).view(np.float32)  # bf16 = the high 16 bits of an f32
    return a


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
    for file in safetensors_files(path):
        with _safe_open(file) as f:
            index |= _dtypes_and_shapes(f, file)
    return index


def sha256_files(paths: list[Path], chunk: int = 1 << 22) -> str:
    """One sha256 over the files' bytes, in order (a model's identity)."""
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            while block := f.read(chunk):
                h.update(block)
    return h.hexdigest()
