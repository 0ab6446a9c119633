"""Read a Hugging Face-layout folder: config.json, (sharded) safetensors, checked against the config.

safetensors is parsed here (header + memory map) rather than through `safetensors.numpy`, because
numpy has no bfloat16: bf16 tensors are widened to float32 bit-exactly (bf16 is the top half of an
f32). Every tensor's name and shape is checked against `ModelConfig.weight_shapes()`.
"""

import json
import struct
from pathlib import Path

import numpy as np

from kolibri_cli.config import ModelConfig
from kolibri_cli.errors import KolibriError

_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}
_IGNORED = ("rotary_emb.inv_freq",)  # buffers some checkpoints carry; recomputed from config


def check_folder(path: Path) -> Path:
    path = Path(path)
    if not path.exists():
        raise KolibriError(f"model folder {path} does not exist")
    if not path.is_dir():
        raise KolibriError(f"{path} is not a folder (expected a Hugging Face model folder)")
    for name in ("config.json", "tokenizer.json"):
        if not (path / name).is_file():
            raise KolibriError(f"{path} has no {name} — not a Hugging Face model folder kolibri can load")
    return path


def safetensors_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / s for s in shards]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise KolibriError(f"{path} has no *.safetensors weights")
    return files


def _header(f, path: Path, size: int) -> tuple[dict, int]:
    raw = f.read(8)
    if len(raw) < 8:
        raise KolibriError(f"{path}: truncated safetensors file (no header)")
    (n,) = struct.unpack("<Q", raw)
    if n > size - 8:
        raise KolibriError(f"{path}: truncated safetensors file (header runs past the end)")
    try:
        header = json.loads(f.read(n))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise KolibriError(f"{path}: not a safetensors file (unreadable header)") from None
    header.pop("__metadata__", None)
    return header, 8 + n


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """All tensors of one file as float32 arrays (f16/bf16 widened)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        header, base = _header(f, path, size)
    end = max((info["data_offsets"][1] for info in header.values()), default=0)
    if base + end > size:
        raise KolibriError(f"{path}: truncated safetensors file ({size} of {base + end} bytes)")
    data = np.memmap(path, dtype=np.uint8, mode="r")
    return {name: _tensor(data, base, name, info, path) for name, info in header.items()}


def _tensor(data: np.ndarray, base: int, name: str, info: dict, path: Path) -> np.ndarray:
    dtype = _DTYPES.get(info["dtype"])
    if dtype is None:
        raise KolibriError(f"{path}: tensor {name} has dtype {info['dtype']}; kolibri reads F32/F16/BF16")
    start, stop = info["data_offsets"]
    a = data[base + start : base + stop].view(dtype).reshape(info["shape"])
    if info["dtype"] == "BF16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32, copy=False)


def load_tensors(path: Path, config: ModelConfig) -> dict[str, np.ndarray]:
    tensors: dict[str, np.ndarray] = {}
    for f in safetensors_files(path):
        if not f.is_file():
            raise KolibriError(f"{path}: shard {f.name} named in the index is missing")
        tensors |= read_safetensors(f)
    tensors = {k: v for k, v in tensors.items() if not k.endswith(_IGNORED)}
    if config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    check_tensors(tensors, config.weight_shapes(), path)
    return tensors


def check_tensors(tensors: dict, expected: dict[str, tuple[int, ...]], path: Path) -> None:
    missing = [n for n in expected if n not in tensors]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise KolibriError(f"{path}: missing tensors {', '.join(missing[:3])}{more}")
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != shape:
            got = tuple(tensors[name].shape)
            raise KolibriError(f"{path}: tensor {name} has shape {got}, config expects {shape}")
    extra = sorted(set(tensors) - set(expected))
    if extra:
        raise KolibriError(f"{path}: unexpected tensors {', '.join(extra[:3])} (architecture mismatch?)")


def tensor_index(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (dtype, shape) from the safetensors headers only (no weights read)."""
    index = {}
    for f in safetensors_files(path):
        with open(f, "rb") as fh:
            header, _ = _header(fh, f, f.stat().st_size)
        index |= {name: (info["dtype"], tuple(info["shape"])) for name, info in header.items()}
    return index
