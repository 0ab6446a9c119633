"""The int16 numeric path: Q4_1/Q8_0 codes times activations quantized to int16 per `int16.SUB`
values, summed as exact integers, each block's scale applied once to its integer sum.

It is not bit-identical to the float32 path, so its laws are its own: each result is the exact
integer dot finished in a fixed float order, within the activation-rounding bound of the float32
path's, batch-invariant for every L and split, tree rows equal to chain rows, speculative output
equal to plain (greedy and sampled); a CPU without F16C is refused in one line. It is the
default path of a model of Q4_1/Q8_0 blocks on a CPU with AVX2 and F16C."""

import mmap
import os
import subprocess
import sys
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import LEAN
from test_block_models import split_logits, tiny_gguf
from test_tree_kernel import tree_vs_chains
from tiny_models import TINY, _Tok

from kolibri_cli.decode.generate import generate_plain, generate_spec
from kolibri_cli.decode.proposers import NgramProposer
from kolibri_cli.decode.sampling import Sampling
from kolibri_cli.engine import blocks, int16, weights
from kolibri_cli.engine.config import ModelConfig
from kolibri_cli.engine.kernel import Transformer
from kolibri_cli.engine.matmul import ALL, matmul
from kolibri_cli.engine.model import load_model, load_weights
from kolibri_cli.engine.weights import int8_matrix, int16_matrix, random_weights, stacked
from kolibri_cli.store import cache, synthetic

pytest.importorskip("gguf")
INT16 = {"Q4_1": "Q4_1x16", "Q8_0": "Q8_0x16"}


def random_matrix(name: str, n: int, k: int, rng):
    """A kernel-storage matrix of random GGUF blocks, and its rows as gguf dequantizes them"""
    from gguf import GGMLQuantizationType, quants

    raw = synthetic.random_rows(name, n, k, rng)
    code = blocks.BY_NAME[name].code
    floats = quants.dequantize(raw, GGMLQuantizationType[name]).reshape(n, k)
    return stacked(code, k, [raw]), floats.astype(np.float64)


def quantized_activations(x: np.ndarray):
    """x [L, K] -> (codes [L, K], scale of each value [L, K]) as the path defines them"""
    runs = x.reshape(x.shape[0], -1, int16.SUB)
    d = np.abs(runs).max(axis=2) / np.float32(32767)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    q = np.rint(runs * inv[:, :, None])
    return q.reshape(x.shape), np.repeat(d, int16.SUB, axis=1)


@pytest.mark.parametrize("name", list(INT16))
@pytest.mark.parametrize("k", [32, 96, 160, 576, 1536])
def test_int16_matmul_is_the_quantized_dot(name, k):
    """Exact arithmetic on the quantized activations, rounded only by the float finish (a few
    float32 ulps of the sum of magnitudes); within the activation-rounding bound of the float32
    path's result; and every call of fewer tokens gives the same bits."""
    rng = np.random.default_rng(k + len(name))
    m, w = random_matrix(name, 37, k, rng)
    m16 = int16_matrix(m)
    assert m16.types == [INT16[name]] and m16.shape == m.shape
    assert m16.nbytes == 37 * (-(-k // 64) * 2) * {"Q4_1": 20, "Q8_0": 34}[name]  # GGUF's bytes
    x = (rng.standard_normal((7, k)) * rng.choice([0.01, 1, 30], (7, 1))).astype(np.float32)
    x[:, 5] *= 40  # an outlier in the first block
    out16, out = np.empty((7, 37), np.float32), np.empty((7, 37), np.float32)
    matmul(x, m16.arrays(), out16, ALL)
    matmul(x, m.arrays(), out, ALL)
    q, d = quantized_activations(x)
    exact = (q * d) @ w.T  # float64 on the int16 activations
    magnitude = (np.abs(q) * d) @ np.abs(w).T
    assert np.all(np.abs(out16 - exact) <= 1e-6 * magnitude + 1e-30)
    assert np.all(np.abs(out16 - out) <= (d / 2) @ np.abs(w).T + 1e-6 * magnitude + 1e-30)
    assert not np.array_equal(out16, out)  # a different numeric path, really
    for n in range(1, 7):  # fewer tokens, wherever they start: the same bits
        for s in (0, 7 - n):
            part = np.empty((n, 37), np.float32)
            matmul(x[s:s + n], m16.arrays(), part, ALL)
            assert np.array_equal(part, out16[s:s + n]), (n, s)


def test_quantize_rounds_half_to_even_per_token_in_the_groups_order():
    x = np.zeros((2, 96), np.float32)
    x[0, :32] = np.linspace(-1, 1, 32, dtype=np.float32)
    x[0, 40:43] = 2.5, 32767, 3.5  # the run's scale is 1: codes 2.5 -> 2, 3.5 -> 4
    x[1, 70] = np.float32(1e-40)  # subnormal: its inverse overflows -> a run of zeros
    xq, xsg, xs, nb = int16.quantize(x)
    assert nb == 4 and int16.group_sizes(nb) == [4]  # 3 blocks, padded: one group of 4
    q, d = quantized_activations(np.concatenate([x, np.zeros((2, 32), np.float32)], axis=1))
    layout = int16.LAYOUT[1, :128]  # slot -> value of a group of 4 blocks
    assert sorted(layout) == list(range(128))
    assert xq[0, :128].tolist() == q[0, layout].tolist()
    # block 1's values 8, 9, 10: run 0, int32 lanes 2 (values 8, 9) and 3 (10) of chunk 2
    assert xq[0, 36:39].tolist() == [2, 32767, 4] and xq[0, 38] == q[0, 42]
    assert xsg[0, :16].tolist() == [d[0, 32 * (i // 2) + 16 * r] for r in range(2)
                                    for i in range(8)]  # 2 lanes per block, per run
    assert xs[0, 0] == np.float32(sum(d[0, 16 * g] * np.float32(q[0, 16 * g:16 * g + 16].sum())
                                      for g in range(2)))
    assert not xq[1].any() and not xs[1].any()
    one = int16.quantize(x[:1])
    assert all(np.array_equal(a[0], b) for a, b in
               zip(one[:3], (xq[0], xsg[0], xs[0]), strict=True))


@pytest.mark.parametrize("repack", [int16_matrix, int8_matrix], ids=["int16", "int8"])
@pytest.mark.parametrize("block_type", list(INT16))
def test_repacking_a_slice_at_a_time_gives_the_one_slice_bytes(kolibri_home, tmp_path,
                                                                 monkeypatch, block_type, repack):
    """The integer paths repack a memory-mapped matrix a slice of rows at a time, dropping each
    slice's file pages once read: slices of 3 rows (a last one of 1 or 2 rows) give the bytes and
    units of one slice of every row, and the file's rows are still read right afterwards."""
    path = tmp_path / f"tiny-{block_type}.gguf"
    tiny_gguf(path, block_type)
    name, folder = cache.import_gguf(path)
    w = load_weights(folder, ModelConfig.from_file(folder / "config.json"), "float32")
    matrices = [w.head, *w.layers[0].matrices()]  # of 300, 512, 256, 1024 and 256 rows
    assert all(isinstance(m.data.base, mmap.mmap) for m in matrices)  # pages to release
    floats = [m.to_float32() for m in matrices]
    whole = [repack(m) for m in matrices]  # _GATHER (1024) rows a slice: one slice each
    monkeypatch.setattr(weights, "_GATHER", 3)
    for m, one in zip(matrices, whole, strict=True):
        sliced = repack(m)
        assert sliced.types == one.types != m.types
        assert np.array_equal(sliced.units, one.units)
        assert np.array_equal(sliced.data, one.data)
    assert {m.shape[0] % 3 for m in matrices} == {0, 1, 2}  # last slices of 3, 1 and 2 rows
    assert all(np.array_equal(m.to_float32(), f) for m, f in zip(matrices, floats, strict=True))


@pytest.mark.bitwise
@pytest.mark.parametrize("block_type", list(INT16))
def test_int16_models_are_batch_invariant(kolibri_home, tmp_path, block_type):
    path = tmp_path / f"tiny-{block_type}.gguf"
    tiny_gguf(path, block_type, tied=block_type == "Q8_0")
    name, folder = cache.import_gguf(path)
    model = load_model(folder, name, numerics="int16", kernels=LEAN)
    assert model.numerics == "int16" and set(model.weights.storage()) == {INT16[block_type]}
    tf = model.transformer
    rng = np.random.default_rng(7)
    ids = rng.integers(0, model.config.vocab_size, 90)
    want = split_logits(tf, ids, [])
    assert np.isfinite(want).all() and want.std() > 0
    for n in range(1, 17):
        assert np.array_equal(split_logits(tf, ids[:n + 3], [n])[:n], want[:n]), n
    for _ in range(3):
        cuts = sorted(rng.choice(np.arange(1, 90), 5, replace=False).tolist())
        assert np.array_equal(split_logits(tf, ids, cuts), want), cuts
    ref = split_logits(load_model(folder, name, numerics="float32", kernels=LEAN).transformer,
                      ids, [])
    # 16-bit activations: the logits stay within a thousandth of their spread of the float32
    # path's (the int8 path's test allows a fifth)
    assert np.abs(want - ref).max() < 1e-3 * ref.std(), np.abs(want - ref).max() / ref.std()


@pytest.mark.bitwise
def test_int16_tree_rows_are_bitwise_chain_rows():
    config = replace(TINY, tie_word_embeddings=True)
    model = Transformer(config, random_weights(config, seed=21, scale=0.2, storage="int16"))
    tree_vs_chains(config, np.array_equal, trials=6, model=model)


@pytest.mark.bitwise
@pytest.mark.parametrize("sampling", [None, Sampling(temperature=0.8, top_k=20, seed=3)],
                         ids=["greedy", "sampled"])
def test_int16_speculative_output_equals_plain(sampling):
    config = replace(TINY, tie_word_embeddings=True)
    accepted = 0
    for seed in range(3):
        weights = random_weights(config, seed=seed, scale=0.1, storage="int16")
        assert set(weights.storage()) == {"Q8_0x16"}
        model = SimpleNamespace(transformer=Transformer(config, weights), eos_ids=(0,),
                                tokenizer=_Tok())
        for prompt in ([5, 6, 7] * 6, [9, 3, 9, 3, 1], list(range(1, 40))):
            kw = {"sampling": sampling} if sampling else {}
            plain = generate_plain(model, prompt, 40, **kw)
            spec = generate_spec(model, prompt, 40, NgramProposer(5, 1, 4), **kw)
            assert spec.output_ids == plain.output_ids
            accepted += spec.spec_stats()["drafts_accepted"]
    assert accepted > 0


_NO_F16C = """
import sys
from pathlib import Path
from kolibri_cli.engine import simd8
from kolibri_cli.engine.model import load_model
from kolibri_cli.errors import KolibriError
assert not simd8.AVX2 and not simd8.TARGET_AVX2 and not simd8.F16C
print(load_model(Path(sys.argv[1]), 'tiny', weights=False).numerics)  # the default here
try:
    load_model(Path(sys.argv[1]), 'tiny', numerics='int16')
except KolibriError as e:
    print(e)
"""


def test_a_cpu_without_f16c_is_refused_in_one_line(kolibri_home, tmp_path):
    """A generic x86-64 target (SSE2 only): widening the float16 scales would need a library
    call numba's JIT lacks (LLVM aborts the process), so the path is refused before compiling."""
    path = tmp_path / "tiny.gguf"
    tiny_gguf(path, "Q4_1", tied=True)
    name, folder = cache.import_gguf(path)
    env = {k: v for k, v in os.environ.items() if k != "KOLIBRI_SIMD"}
    env |= {"NUMBA_CPU_NAME": "x86-64", "NUMBA_CPU_FEATURES": "",
            "NUMBA_CACHE_DIR": str(tmp_path / "nc")}
    proc = subprocess.run([sys.executable, "-c", _NO_F16C, str(folder)], env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    default, refused = proc.stdout.split("\n", 1)
    assert default == "float32"  # without AVX2 and F16C int16 is not the default
    assert refused.startswith("--quantize int16 needs a CPU with F16C"), proc.stdout


@pytest.mark.parametrize("avx2, f16c", [(True, True), (False, True), (True, False)])
def test_the_default_path_is_int16_on_q4_1_q8_0_blocks_with_avx2_and_f16c(
        kolibri_home, tmp_path, monkeypatch, tiny_llama_folder, avx2, f16c):
    """A cache model of Q4_1/Q8_0 blocks runs int16 without --quantize where the CPU has AVX2
    and F16C, float32 elsewhere; other block types, and float tensors, stay float32."""
    from kolibri_cli.engine import simd8
    from kolibri_cli.store.models import default_numerics_of, open_model

    monkeypatch.setattr(simd8, "TARGET_AVX2", avx2)
    monkeypatch.setattr(simd8, "F16C", f16c)
    monkeypatch.setattr(simd8, "AVX2", False)  # KOLIBRI_SIMD=portable: other code, same path
    want = "int16" if avx2 and f16c else "float32"
    path = tmp_path / "tiny.gguf"
    tiny_gguf(path, lambda kind, layer, n: "Q8_0" if kind == "token_embd" else "Q4_1")
    name, _ = cache.import_gguf(path)
    assert open_model(name, weights=False).numerics == want
    assert default_numerics_of(name) == want
    assert default_numerics_of(None) == want  # the registry's model, known before its pull
    tiny_gguf(tmp_path / "q4_0.gguf", "Q4_0")
    other, _ = cache.import_gguf(tmp_path / "q4_0.gguf")
    assert open_model(other, weights=False).numerics == "float32"
    assert open_model(str(tiny_llama_folder()), weights=False).numerics == "float32"
    assert open_model(name, weights=False, numerics="float32").numerics == "float32"


def test_the_default_model_runs_int16_weights(kolibri_home, tmp_path):
    """On this CPU's flags: the default of a Q4_1/Q8_0 model is what load_model repacks."""
    from kolibri_cli.engine import simd8

    path = tmp_path / "tiny.gguf"
    tiny_gguf(path, "Q4_1")  # the types of test_int16_models_are_batch_invariant's: one compile
    name, folder = cache.import_gguf(path)
    model = load_model(folder, name, kernels=("lean",))
    if not (simd8.TARGET_AVX2 and simd8.F16C):
        assert model.numerics == "float32"
        return
    assert model.numerics == "int16" and set(model.weights.storage()) == {"Q4_1x16"}


_PORTABLE = """
import sys
from pathlib import Path
import numpy as np
from kolibri_cli.engine import simd8
from kolibri_cli.engine.model import load_model
assert not simd8.AVX2 and simd8.TARGET_AVX2  # the portable code, on the int16 path
folder, ids, cuts, out = sys.argv[1:]
tf = load_model(Path(folder), "tiny", numerics="int16", kernels=("lean",)).transformer
ids = np.load(ids)
bounds = [0, *map(int, cuts.split(",")), len(ids)]
cache = tf.new_cache(len(ids))
np.save(out, np.concatenate([tf.forward(ids[a:b], a, cache) for a, b in zip(bounds, bounds[1:])]))
"""


def _mixed_types(kind, layer, n_layers):
    """Q4_1 and Q8_0 each on rows of 576 and of 1504 weights (18 blocks: groups of 8, 8, 2;
    47: an odd count, a zero block added)"""
    if kind in ("attn_q", "attn_k", "attn_v", "output"):
        return "Q4_1"
    if kind in ("attn_output", "token_embd"):
        return "Q8_0"
    gate_up, down = ("Q8_0", "Q4_1") if layer == 0 else ("Q4_1", "Q8_0")
    return down if kind == "ffn_down" else gate_up


@pytest.mark.bitwise
def test_portable_int16_code_gives_the_avx2_bits(kolibri_home, tmp_path):
    """KOLIBRI_SIMD=portable, in a process with its own numba cache as a CPU without AVX2 code
    would run it (integer multiply-adds from widened products, scales spread by lane extracts),
    gives bitwise the logits of this host's AVX2 code, for every L kind (1, the verify passes
    2..6, prefill)."""
    from kolibri_cli.engine import simd8

    if not simd8.AVX2:
        pytest.skip("this CPU runs the portable int16 code already")
    path = tmp_path / "tiny-int16.gguf"
    tiny_gguf(path, _mixed_types, d=576, ff=1504, heads=9, kv_heads=3, vocab=301)
    name, folder = cache.import_gguf(path)
    model = load_model(folder, name, numerics="int16", kernels=LEAN)
    assert set(model.weights.storage()) == {"Q4_1x16", "Q8_0x16"}
    ids = np.random.default_rng(16).integers(0, model.config.vocab_size, 60)
    cuts = [1, 2, 4, 7, 11, 16, 22]
    want = split_logits(model.transformer, ids, cuts)
    assert np.isfinite(want).all() and want.std() > 0
    np.save(tmp_path / "ids.npy", ids)
    env = os.environ | {"KOLIBRI_SIMD": "portable", "NUMBA_CACHE_DIR": str(tmp_path / "nc")}
    out = tmp_path / "portable.npy"
    args = [str(folder), str(tmp_path / "ids.npy"), ",".join(map(str, cuts)), str(out)]
    proc = subprocess.run([sys.executable, "-c", _PORTABLE, *args], env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    got = np.load(out)
    assert got.dtype == np.float32 and np.array_equal(got, want)


@pytest.mark.bitwise
@pytest.mark.parametrize("name", list(INT16))
def test_int16_tiles_give_the_oracles_bits(name):
    """Every tile (one token x 4 rows, 4 tokens x 1 row, short and lone-token tiles) gives, for
    each (row, token), the bits of the path's arithmetic written out once (`int16_before`): the
    same integers, the same float operations in the same order, so the path's measured fidelity
    holds"""
    from int16_before import reference_matmul

    rng = np.random.default_rng(len(name))
    for nb in (1, 2, 3, 7, 8, 9, 17, 18, 48):  # odd counts, partial and whole groups
        n, k = 1 + int(rng.integers(1, 23)), 32 * nb
        m, _ = random_matrix(name, n, k, rng)
        rows = m.data.reshape(n, -1)
        x = (rng.standard_normal((7, k)) * rng.choice([1e-3, 1, 50], (7, 1))).astype(np.float32)
        x[:, rng.integers(0, k, 3)] *= 30  # outliers
        want = reference_matmul(name == "Q4_1", rows, x)
        m16 = int16_matrix(m)
        for n_tok in range(1, 8):
            got = np.empty((n_tok, n), np.float32)
            matmul(x[:n_tok], m16.arrays(), got, ALL)
            assert np.array_equal(got.view(np.uint32), want[:n_tok].view(np.uint32)), (nb, n_tok)
