"""Block storage: every type decodes to exactly gguf's floats, and a matmul over any type gives
bitwise the float32 path's result (its dequantized rows), for every L and tile."""

import os
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest
from conftest import LEAN
from test_block_models import avx2_split_logits, split_logits, tiny_gguf

from kolibri_cli.engine import blocks, int8, int16, simd
from kolibri_cli.engine import matmul as matmul_module
from kolibri_cli.engine.matmul import ALL, matmul
from kolibri_cli.engine.model import load_model
from kolibri_cli.engine.weights import Matrix, Rows, stacked
from kolibri_cli.store import cache

gguf = pytest.importorskip("gguf")
G = gguf.GGMLQuantizationType
QUANT = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
FLOAT = ["F32", "F16", "BF16"]
# byte offsets of a block's float16 fields, with a scale that keeps weights ~0.02 (finite)
HALVES = {"Q4_0": {0: 0.005}, "Q4_1": {0: 0.003, 2: -0.02}, "Q5_0": {0: 0.002},
          "Q5_1": {0: 0.0015, 2: -0.02}, "Q8_0": {0: 0.0003}, "Q4_K": {0: 1e-4, 2: 7.5e-4},
          "Q5_K": {0: 5e-5, 2: 7.5e-4}, "Q6_K": {208: 1.5e-5}}


def random_file_rows(name: str, n: int, k: int, rng) -> np.ndarray:
    """GGUF rows [n, file row bytes] of random blocks (every code, scale sign and sub-scale)."""
    t = blocks.BY_NAME[name]
    if name in FLOAT:
        w = rng.standard_normal((n, k)).astype(np.float32)
        if name == "F16":
            return w.astype(np.float16).view(np.uint8)
        if name == "BF16":
            return (w.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        return w.view(np.uint8)
    raw = rng.integers(0, 256, (n, k // t.weights, t.bytes), dtype=np.uint8)
    for off, scale in HALVES[name].items():
        h = (scale * rng.choice([-1, 1], raw.shape[:2]) * (0.5 + rng.random(raw.shape[:2])))
        raw[:, :, off:off + 2] = h.astype(np.float16).view(np.uint8).reshape(*raw.shape[:2], 2)
    return raw.reshape(n, -1)


def storage_matrix(name: str, file_rows: np.ndarray, k: int) -> Matrix:
    t = blocks.BY_NAME[name]
    if name == "F32":
        rows = blocks.float_rows(t.code, file_rows.view(np.float32).reshape(-1, k))
    elif name == "F16":
        rows = blocks.float_rows(t.code, file_rows.view(np.float16).reshape(-1, k))
    elif name == "BF16":
        rows = blocks.float_rows(t.code, file_rows.view(np.uint16).reshape(-1, k))
    else:
        rows = file_rows  # the GGUF's own blocks: kernel storage as they are
    return stacked(t.code, k, [rows])


def gguf_floats(name: str, file_rows: np.ndarray, k: int) -> np.ndarray:
    return gguf.quants.dequantize(file_rows, G[name]).astype(np.float32).reshape(-1, k)


@pytest.mark.parametrize("name", QUANT + FLOAT)
def test_decoded_rows_are_gguf_floats(name):
    rng = np.random.default_rng(len(name) + ord(name[1]))
    k = 512
    file_rows = random_file_rows(name, 9, k, rng)
    got = storage_matrix(name, file_rows, k).to_float32()
    want = gguf_floats(name, file_rows, k)
    assert got.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))  # -0.0 included


@pytest.mark.parametrize("name", QUANT + FLOAT)
def test_matmul_equals_float32_path_for_every_l(name):
    """x @ w.T over blocks == over the decoded float32 rows, bitwise, for L = 1..16, 31..33 and a
    long call split at random points; every row of an L-row call == the 1-row call."""
    rng = np.random.default_rng(ord(name[-1]))
    n, k = 42, 512  # 42 rows: units of 4 and a short one
    file_rows = random_file_rows(name, n, k, rng)
    m = storage_matrix(name, file_rows, k)
    f = stacked(blocks.F32, k, [blocks.float_rows(blocks.F32, gguf_floats(name, file_rows, k))])
    x = rng.standard_normal((150, k)).astype(np.float32)
    alone = np.empty((150, n), np.float32)
    for j in range(150):
        matmul(x[j:j + 1], f.arrays(), alone[j:j + 1], ALL)
    for L in [*range(1, 17), 31, 32, 33, 64, 65, 150]:  # verify sizes, then tiles
        out = np.empty((L, n), np.float32)
        matmul(x[:L], m.arrays(), out, ALL)
        assert np.array_equal(out.view(np.uint32), alone[:L].view(np.uint32)), L
    cuts = np.sort(rng.choice(np.arange(1, 150), 6, replace=False))
    parts = []
    for a, b in zip([0, *cuts], [*cuts, 150], strict=True):
        out = np.empty((b - a, n), np.float32)
        matmul(x[a:b], m.arrays(), out, ALL)
        parts.append(out)
    assert np.array_equal(np.concatenate(parts).view(np.uint32), alone.view(np.uint32))


@pytest.mark.parametrize("name", QUANT + FLOAT)
def test_verify_sized_calls_on_short_units_and_odd_widths(name):
    """Calls of 1..17 tokens (every group size 1..8, in the 4- and 2-row tiles) on units of 1,
    3 and 4 rows, at a width that is not a multiple of 256 (nor of 32 for float rows), equal the
    1-row dots of the float32 path, bitwise, wherever the call starts."""
    rng = np.random.default_rng(ord(name[0]) + ord(name[-1]))
    k = 50 if name in FLOAT else {32: 160, 256: 768}[blocks.BY_NAME[name].weights]
    x = rng.standard_normal((19, k)).astype(np.float32)
    for n in (1, 3, 7):
        file_rows = random_file_rows(name, n, k, rng)
        m = storage_matrix(name, file_rows, k)
        assert set(m.units[:, 1]) == ({1} if n == 1 else {3} if n == 3 else {4, 3})
        f = stacked(blocks.F32, k, [blocks.float_rows(blocks.F32, gguf_floats(name, file_rows, k))])
        alone = np.empty((len(x), n), np.float32)
        for j in range(len(x)):
            matmul(x[j:j + 1], f.arrays(), alone[j:j + 1], ALL)
        for L in range(1, 18):
            for s in (0, len(x) - L):
                out = np.empty((L, n), np.float32)
                matmul(x[s:s + L], m.arrays(), out, ALL)
                assert np.array_equal(out.view(np.uint32), alone[s:s + L].view(np.uint32)), (n, L)


def _fma32(a, b, c) -> np.float32:
    """fl(a*b + c) for float32 a, b, c: the exact value rounded once, to nearest even"""
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    near = np.float32(float(exact))
    inf = np.float32(np.inf)
    candidates = [np.nextafter(near, -inf), near, np.nextafter(near, inf)]
    dist = [abs(Fraction(float(v)) - exact) for v in candidates]
    best = min(dist)
    ties = [v for v, e in zip(candidates, dist, strict=True) if e == best]
    return min(ties, key=lambda v: int(np.array(v).view(np.uint32)) & 1)


def test_matmul_is_the_fixed_order_dot():
    """The order itself: 16 lanes of fused multiply-adds in increasing k, then the tree."""
    rng = np.random.default_rng(3)
    k = 48
    w = rng.standard_normal((5, k)).astype(np.float32)
    x = rng.standard_normal((1, k)).astype(np.float32)
    out = np.empty((1, 5), np.float32)
    matmul(x, stacked(blocks.F32, k, [blocks.float_rows(blocks.F32, w)]).arrays(), out, ALL)
    for r in range(5):
        lanes = [np.float32(0)] * 16
        for c in range(0, k, 16):
            lanes = [_fma32(w[r, c + i], x[0, c + i], lanes[i]) for i in range(16)]
        v = np.array(lanes, np.float32)
        while len(v) > 1:
            v = (v[:len(v) // 2] + v[len(v) // 2:]).astype(np.float32)
        assert out[0, r] == v[0]


def test_verify_tiles_cover_every_block_type():
    """The verify tiles are compiled one per block type (matmul.ORDER): a type missing there
    would take F32's tile and read its blocks as floats."""
    exact = {code for code in blocks.TYPES
             if code not in (int8.Q4_1X, int8.Q8_0X, int16.Q4_1W, int16.Q8_0W)}
    assert sorted(matmul_module.ORDER) == sorted(exact)
    assert {blocks.BY_NAME[name].code for name in QUANT + FLOAT} == exact  # all tested above


def test_units_follow_row_addresses():
    """Rows read with a stride (llama.cpp's Q/K order) or out of order form correct units."""
    rng = np.random.default_rng(4)
    k = 64
    w = rng.standard_normal((12, k)).astype(np.float32)
    rows = blocks.float_rows(blocks.F32, w)
    order = np.array([0, 2, 4, 6, 1, 3, 5, 7, 11, 10, 8, 9])
    m = Matrix.of_rows(rows.reshape(-1), [Rows(blocks.F32, rows.shape[1] * order, k)])
    assert np.array_equal(m.to_float32(), w[order])
    x = rng.standard_normal((3, k)).astype(np.float32)
    out = np.empty((3, 12), np.float32)
    matmul(x, m.arrays(), out, ALL)
    assert np.allclose(out, x @ w[order].T, atol=1e-5)


def test_portable_path_gives_the_same_bits(tmp_path):
    """Without AVX-512 table lookups the decoders compute the same floats (run in a process
    with its own numba cache, as another CPU would)."""
    if not simd.LUT:
        pytest.skip("this CPU runs the portable path already")
    code = ("import sys; sys.argv=['x']; from kolibri_cli.engine import simd; "
            "assert not simd.LUT; import pytest; "
            "sys.exit(pytest.main(['-q', '-x', '-p', 'no:cacheprovider', "
            f"'{__file__}::test_decoded_rows_are_gguf_floats']))")
    env = os.environ | {"KOLIBRI_SIMD": "portable", "NUMBA_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


# Every decoder in one model: the K-quants where rows are 1536 wide (ffn_down), the others on the
# 576-wide rows; 301 vocabulary rows leave a unit of one row.
MIXED = {"attn_q": "Q4_0", "attn_k": "Q5_0", "attn_v": "Q5_1", "attn_output": "Q4_1",
         "ffn_gate": "Q8_0", "ffn_up": "F16", "token_embd": "Q8_0", "output": "BF16"}
K_QUANTS = ("Q4_K", "Q5_K", "Q6_K")  # ffn_down of layers 0, 1, 2


def mixed_types(kind, layer, n_layers):
    return K_QUANTS[layer] if kind == "ffn_down" else MIXED[kind]


# L = 1 past the first position, 2..6 (verify passes), then 38 (prefill)
AVX2_CUTS = [1, 2, 4, 7, 11, 16, 22]


@pytest.mark.bitwise
def test_avx2_build_gives_the_host_bits(kolibri_home, tmp_path):
    """kolibri compiled for an AVX2 CPU (no AVX-512: no table lookups, 16 lanes in two 256-bit
    halves) gives bitwise the logits of this host's AVX-512 build, for every block type."""
    if not simd.LUT:
        pytest.skip("this CPU runs the code without AVX-512 already")
    path = tmp_path / "mixed.gguf"
    tiny_gguf(path, mixed_types, n_layers=3, d=576, ff=1536, heads=9, kv_heads=3, vocab=301)
    name, folder = cache.import_gguf(path)
    model = load_model(folder, name, kernels=LEAN)
    assert set(model.weights.storage()) == set(MIXED.values()) | set(K_QUANTS)
    ids = np.random.default_rng(5).integers(0, model.config.vocab_size, 60)
    want = split_logits(model.transformer, ids, AVX2_CUTS)
    assert np.isfinite(want).all() and want.std() > 0
    got = avx2_split_logits(folder, "float32", ids, AVX2_CUTS, tmp_path)
    assert got.dtype == np.float32 and np.array_equal(got, want)
