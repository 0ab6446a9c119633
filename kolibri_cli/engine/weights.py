"""Weights laid out once for the kernel: each matrix a `Matrix` of units over a byte buffer (see
`matmul`), norms and biases float32 arrays. The fused QKV and gate/up matrices are the units of
their parts in order; nothing is copied to fuse them.

Two sources: float tensors by Hugging Face name (`layout`: stored as F32 rows, or quantized to
Q8_0 on request), and kernel-layout blocks in a memory-mapped model cache (`Matrix.of_rows`
over the cache buffer, built by `store`). Optional parts (q/k/v biases, q/k norms) are
zero-length arrays when the architecture lacks them: the kernel tests `.shape[0]`.
"""

import contextlib
from dataclasses import dataclass, field

import numpy as np

from kolibri_cli.engine import blocks
from kolibri_cli.engine.config import ModelConfig

STORAGE = ("float32", "q8_0", "int8", "int16")  # numeric paths: float32 on the stored values,
# float32 weights quantized to Q8_0 at load, the int8 path (`int8_weights`) and the int16 path
# (`int16_weights`)


def _none() -> np.ndarray:
    return np.zeros(0, np.float32)  # [0]: "this layer has no such part"


@dataclass(frozen=True)
class Rows:
    """Rows of one stored tensor: their block type and byte addresses in a buffer."""

    code: int  # blocks.TYPES key
    at: np.ndarray  # int64 [n]: byte address of each row, in the matrix's row order
    k: int  # weights per row


@dataclass
class Matrix:
    """A weight matrix [N, K] as the kernel reads it: (data, units), see `matmul`."""

    data: np.ndarray  # uint8 [bytes]: the buffer every row lives in
    units: np.ndarray  # int64 [U, 5]: (first row, rows <= 4, block type, byte offset, stride)
    shape: tuple[int, int]  # (N, K)

    @classmethod
    def of_rows(cls, data: np.ndarray, parts: list[Rows]) -> "Matrix":
        """The matrix whose rows are the parts' rows, stacked in order."""
        units, first = [], 0
        for part in parts:
            units += _units(part, first)
            first += len(part.at)
        k = {p.k for p in parts}
        if len(k) != 1:
            raise ValueError(f"parts of one matrix differ in width: {sorted(k)}")
        return cls(data, np.array(units, np.int64).reshape(-1, 5), (first, k.pop()))

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return self.data, self.units

    @property
    def nbytes(self) -> int:
        """Bytes of storage a decode step reads for this matrix."""
        k = self.shape[1]
        return int(sum(n * blocks.TYPES[t].row_bytes(k) for _, n, t, _, _ in self.units))

    @property
    def types(self) -> list[str]:
        return sorted({blocks.TYPES[int(t)].name for t in self.units[:, 2]})

    def to_float32(self) -> np.ndarray:
        """[N, K] float32: every row decoded (references and tests)."""
        from kolibri_cli.engine.matmul import decode_rows

        n, k = self.shape
        kp = -(-k // 32) * 32
        out = np.zeros((n, kp), np.float32)
        for r0, count, t, o, stride in self.units:
            decode_rows(t, self.data, o, stride, count, kp, out[r0:r0 + count])
        return np.ascontiguousarray(out[:, :k])


def _units(part: Rows, first: int) -> list[tuple[int, ...]]:
    """Up to 4 consecutive rows per unit, whenever their addresses are evenly spaced."""
    out, i, at = [], 0, part.at
    while i < len(at):
        n = 1
        while n < 4 and i + n < len(at) and at[i + n] - at[i + n - 1] == (at[i + 1] - at[i]):
            n += 1
        stride = int(at[i + 1] - at[i]) if n > 1 else 0
        out.append((first + i, n, part.code, int(at[i]), stride))
        i += n
    return out


_INT8 = {blocks.Q4_1: (blocks.int8.Q4_1X, blocks.int8.repack_q4_1),
         blocks.Q8_0: (blocks.int8.Q8_0X, blocks.int8.repack_q8_0)}


def int8_matrix(m: Matrix) -> Matrix:
    """m in the int8 path's layout (a copy) when all its rows are Q4_1 or all Q8_0; else m,
    which then stays on the float32 path."""
    if (code := _one_type(m, _INT8)) is None:
        return m
    new_code, repack = _INT8[code]
    return _repacked(m, code, lambda rows: (new_code, repack(blocks.widen_scales(code, rows))))


def _one_type(m: Matrix, types) -> int | None:
    """The block type of m's rows when they are all of one type in `types`, else None"""
    codes = {int(t) for t in m.units[:, 2]}
    return code if len(codes) == 1 and (code := codes.pop()) in types else None


def _repacked(m: Matrix, code: int, repack) -> Matrix:
    """m's rows (all of block type `code`) repacked into a new buffer a slice of rows at a time:
    repack(rows [n, row bytes]) -> (new block type, rows [n, new row bytes]). Each slice's pages
    are released once read where m reads a memory-mapped file, so that the file's pages and the
    new rows are not both held (nor a whole-matrix gathered copy)."""
    width = blocks.TYPES[code].row_bytes(m.shape[1])
    at = np.concatenate([o + stride * np.arange(n) for _, n, _, o, stride in m.units])
    out = None
    for s in range(0, len(at), _GATHER):  # an index of 8 bytes per byte, a slice at a time
        new_code, part = repack(m.data[at[s:s + _GATHER, None] + np.arange(width)])
        if out is None:
            out = np.empty((len(at), part.shape[1]), np.uint8)  # [N, new row bytes]
        out[s:s + _GATHER] = part
        _release_pages(m.data, at[s:s + _GATHER], width)
    rows = Rows(new_code, out.shape[1] * np.arange(len(at), dtype=np.int64), m.shape[1])
    return Matrix.of_rows(out.reshape(-1), [rows])


_GATHER = 1024  # rows repacked per slice (the head's: 5 MB of indices, 0.6 MB of rows)


def int8_weights(w: "Weights") -> "Weights":
    """The int8 numeric path: every Q4_1/Q8_0 matrix (the head too) repacked for integer dots
    with int8 activations (`engine.int8`); other matrices, and the embedding lookup, keep the
    float32 path."""
    return _each_matrix(w, int8_matrix)


def int16_matrix(m: Matrix) -> Matrix:
    """m in the int16 path's layout (a copy, the GGUF's bytes) when all its rows are Q4_1 or
    all Q8_0; else m, which then stays on the float32 path."""
    if (code := _one_type(m, (blocks.Q4_1, blocks.Q8_0))) is None:
        return m
    return _repacked(m, code, lambda rows: blocks.int16.repack(code == blocks.Q4_1, rows))


def int16_weights(w: "Weights") -> "Weights":
    """The int16 numeric path: every Q4_1/Q8_0 matrix (the head too) repacked for integer dots
    with int16 activations (`engine.int16`); other matrices, and the embedding lookup, keep the
    float32 path."""
    return _each_matrix(w, int16_matrix)


def _each_matrix(w: "Weights", matrix) -> "Weights":
    """w with matrix(m) for every layer matrix and the head (one copy of the weights in memory,
    not two: see `_repacked`)"""
    from dataclasses import replace

    layers = [replace(lw, wqkv=matrix(lw.wqkv), wo=matrix(lw.wo),
                      w_gate_up=matrix(lw.w_gate_up), w_down=matrix(lw.w_down))
              for lw in w.layers]
    return replace(w, layers=layers, head=matrix(w.head))


def _release_pages(data: np.ndarray, at: np.ndarray, width: int) -> None:
    """Drop the pages of the rows at byte addresses `at` (each `width` bytes) of `data` from
    memory where data is a memory-mapped file (np.memmap at offset 0, as blockfile maps them;
    never written: a later read, the embedding lookup's, faults them in again from the file)."""
    import mmap

    if (not isinstance(data.base, mmap.mmap) or not len(at)
            or not hasattr(mmap, "MADV_DONTNEED")):  # not Windows
        return
    start = int(at.min()) // mmap.PAGESIZE * mmap.PAGESIZE
    end = min(int(at.max()) + width, len(data.base))
    with contextlib.suppress(OSError):  # e.g. locked pages (mlockall): only memory is lost
        data.base.madvise(mmap.MADV_DONTNEED, start, end - start)


INTEGER_PATHS = {"int8": int8_weights, "int16": int16_weights}  # numeric path -> its repacking
REPACKED = {"int8": "x8", "int16": "x16"}  # integer path -> suffix of its repacked types' names
DEFAULT_TYPES = ("Q4_1", "Q8_0")  # block types the integer paths repack (int8_matrix, int16_matrix)


def default_numerics(types) -> str:
    """The numeric path a model runs when none is asked for: "int16" (the fastest path that
    reproduces the float32 reference's chains, docs/bench.md) when every matrix of the model,
    the embedding included, is Q4_1 or Q8_0 blocks (a cache model from such a GGUF) and the CPU
    target has AVX2 and F16C (without them int16's code is slower than float32's; KOLIBRI_SIMD
    forcing the portable code changes the code, not the path); else "float32"
    (float weights too: int16 would quantize them first). `types`: the matrices' block type
    names."""
    from kolibri_cli.engine import simd8

    fast = simd8.TARGET_AVX2 and simd8.F16C
    return "int16" if fast and types and set(types) <= set(DEFAULT_TYPES) else "float32"


def kernel_types(types: tuple[str, ...], numerics: str) -> tuple[str, ...]:
    """The block types the kernel meets on `numerics` for a model whose matrices are of `types`,
    the embedding's first (its lookup keeps the stored blocks): each Q4_1/Q8_0 repacked on an
    integer path. What store/precompile compiles for, before the model is there."""
    suffix = REPACKED.get(numerics)
    if suffix is None:
        return types
    repacked = (t + suffix if t in DEFAULT_TYPES else t for t in types)
    return tuple(dict.fromkeys((types[0], *repacked)))


def stacked(code: int, k: int, rows: list[np.ndarray]) -> Matrix:
    """The matrix of several tensors' kernel-storage rows [n_i, row bytes], copied into one
    buffer one after another."""
    data = np.concatenate([np.ascontiguousarray(r).reshape(-1) for r in rows])
    parts, offset = [], 0
    for r in rows:
        parts.append(Rows(code, offset + r.shape[1] * np.arange(r.shape[0], dtype=np.int64), k))
        offset += r.nbytes
    return Matrix.of_rows(data, parts)


def float_matrix(tensors: list[np.ndarray], storage: str = "float32") -> Matrix:
    """Float tensors [n_i, K] stacked row-wise: F32 rows, or Q8_0 blocks (K a multiple of 32)."""
    k = tensors[0].shape[1]
    if storage == "q8_0" and k % 32 == 0:
        from gguf import GGMLQuantizationType, quants

        rows = [quants.quantize(np.asarray(t, np.float32), GGMLQuantizationType.Q8_0)
                for t in tensors]
        code = blocks.Q8_0
    else:
        rows = [blocks.float_rows(blocks.F32, np.asarray(t, np.float32)) for t in tensors]
        code = blocks.F32
    return stacked(code, k, rows)


@dataclass
class LayerWeights:
    attn_norm: np.ndarray  # [D]
    wqkv: Matrix  # [(H + 2*KVH) * Dh, D]  rows: q heads, then k heads, then v heads
    wo: Matrix  # [D, H*Dh]
    mlp_norm: np.ndarray  # [D]
    w_gate_up: Matrix  # [2F, D]  rows: gate then up
    w_down: Matrix  # [D, F]
    bqkv: np.ndarray = field(default_factory=_none)  # [(H + 2*KVH) * Dh] biases (Qwen2) | [0]
    q_norm: np.ndarray = field(default_factory=_none)  # [Dh] q head RMSNorm (Qwen3) | [0]
    k_norm: np.ndarray = field(default_factory=_none)  # [Dh] k head RMSNorm (Qwen3) | [0]

    def arrays(self) -> tuple:
        """The tuple the kernel's `_layer` unpacks (order matters)."""
        return (self.attn_norm, self.wqkv.arrays(), self.wo.arrays(), self.mlp_norm,
                self.w_gate_up.arrays(), self.w_down.arrays(), self.bqkv, self.q_norm,
                self.k_norm)

    def matrices(self) -> list[Matrix]:
        return [self.wqkv, self.wo, self.w_gate_up, self.w_down]


@dataclass
class Weights:
    embed: Matrix  # [V, D]
    layers: list[LayerWeights]
    norm: np.ndarray  # [D]
    head: Matrix  # [V, D]; the same object as `embed` when tied

    def nbytes_per_token(self) -> int:
        """Bytes of weights a decode step reads: every layer matrix and vector, the final norm
        and the head (the embedding lookup reads one row: not counted)."""
        vectors = sum(a.nbytes for lw in self.layers
                      for a in (lw.attn_norm, lw.mlp_norm, lw.bqkv, lw.q_norm, lw.k_norm))
        matrices = sum(m.nbytes for lw in self.layers for m in lw.matrices())
        return vectors + matrices + self.norm.nbytes + self.head.nbytes

    def storage(self) -> dict[str, int]:
        """Block type name -> matrices holding it (a fused matrix counts once per type)."""
        counts: dict[str, int] = {}
        for m in [self.head, *(m for lw in self.layers for m in lw.matrices())]:
            for t in m.types:
                counts[t] = counts.get(t, 0) + 1
        return counts


def _f32(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def _layer(config: ModelConfig, tensors: dict[str, np.ndarray], i: int,
           storage: str) -> LayerWeights:
    p = f"model.layers.{i}."
    t = lambda name: tensors[p + name]  # noqa: E731
    m = lambda *names: float_matrix([t(n) for n in names], storage)  # noqa: E731
    lw = LayerWeights(
        attn_norm=_f32(t("input_layernorm.weight")),
        wqkv=m(*(f"self_attn.{x}_proj.weight" for x in "qkv")),
        wo=m("self_attn.o_proj.weight"),
        mlp_norm=_f32(t("post_attention_layernorm.weight")),
        w_gate_up=m("mlp.gate_proj.weight", "mlp.up_proj.weight"),
        w_down=m("mlp.down_proj.weight"),
    )
    if config.qkv_bias:
        lw.bqkv = _f32(np.concatenate([t(f"self_attn.{x}_proj.bias") for x in "qkv"]))
    if config.qk_norm:
        lw.q_norm = _f32(t("self_attn.q_norm.weight"))
        lw.k_norm = _f32(t("self_attn.k_norm.weight"))
    return lw


def layout(config: ModelConfig, tensors: dict[str, np.ndarray],
           storage: str = "float32") -> Weights:
    """HF tensor names -> kernel layout (`tensors` already checked against weight_shapes()).
    storage "q8_0" quantizes every matrix whose width is a multiple of 32 (gguf's Q8_0)."""
    layers = [_layer(config, tensors, i, storage) for i in range(config.num_hidden_layers)]
    embed = float_matrix([tensors["model.embed_tokens.weight"]], storage)
    head = (embed if config.tie_word_embeddings
            else float_matrix([tensors["lm_head.weight"]], storage))
    return Weights(embed=embed, layers=layers, norm=_f32(tensors["model.norm.weight"]), head=head)


def random_weights(config: ModelConfig, seed: int = 0, scale: float = 0.02,
                   storage: str = "float32") -> Weights:
    """Random weights for tests and kernel benchmarks (no checkpoint needed); storage one of
    STORAGE (int8, int16: Q8_0 blocks on that numeric path)."""
    rng = np.random.default_rng(seed)
    tensors = {
        name: (1.0 + scale * rng.standard_normal(shape)) if name.endswith("norm.weight")
        else scale * rng.standard_normal(shape)
        for name, shape in config.weight_shapes().items()
    }
    if storage in INTEGER_PATHS:
        return INTEGER_PATHS[storage](layout(config, tensors, "q8_0"))
    return layout(config, tensors, storage)
