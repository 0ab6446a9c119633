"""The int8 numeric path (`--quantize int8`): Q4_1/Q8_0 blocks times int8-quantized activations.

It is not bit-identical to the float32 path, so its laws are its own: each result is the exact
integer dot finished in a fixed float order (close to float64 arithmetic on the quantized
activations), within the activation-rounding bound of the float32 path's, batch-invariant for
every L and split, speculative output equal to plain, and the portable integer code gives the
VNNI bits."""

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import LEAN
from test_block_models import avx2_split_logits, split_logits, tiny_gguf
from tiny_models import TINY, _Tok

from kolibri_cli.decode.generate import generate_plain, generate_spec
from kolibri_cli.decode.proposers import NgramProposer
from kolibri_cli.engine import blocks, int8, simd
from kolibri_cli.engine.kernel import Transformer
from kolibri_cli.engine.matmul import ALL, matmul
from kolibri_cli.engine.model import load_model
from kolibri_cli.engine.weights import int8_matrix, int8_weights, random_weights, stacked
from kolibri_cli.goldens.chains import load_goldens
from kolibri_cli.goldens.record import check_one
from kolibri_cli.store import cache, synthetic

pytest.importorskip("gguf")
INT8 = {"Q4_1": "Q4_1x8", "Q8_0": "Q8_0x8"}


def random_matrix(name: str, n: int, k: int, rng):
    """A kernel-storage matrix of random GGUF blocks, and its rows as gguf dequantizes them"""
    from gguf import GGMLQuantizationType, quants

    raw = synthetic.random_rows(name, n, k, rng)
    code = blocks.BY_NAME[name].code
    floats = quants.dequantize(raw, GGMLQuantizationType[name]).reshape(n, k)
    return stacked(code, k, [raw]), floats.astype(np.float64)


def quantized_activations(x: np.ndarray):
    """x [L, K] -> (codes [L, K], d [L, K/32]) as the path defines them, in numpy"""
    blocks_ = x.reshape(x.shape[0], -1, 32)
    d = np.abs(blocks_).max(axis=2) / np.float32(127)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    q = np.rint(blocks_ * inv[:, :, None])
    return q.reshape(x.shape), d


@pytest.mark.parametrize("name", list(INT8))
@pytest.mark.parametrize("k", [32, 96, 576, 1536])
def test_int8_matmul_is_the_quantized_dot(name, k):
    """Exact arithmetic on the quantized activations, rounded only by the float finish
    (a few float32 ulps of the sum of magnitudes); and within the activation-rounding bound
    sum_b d_x[b]/2 * sum_{i in b} |w_i| of the float32 path's result."""
    rng = np.random.default_rng(k)
    m, w = random_matrix(name, 37, k, rng)
    m8 = int8_matrix(m)
    assert m8.types == [INT8[name]] and m8.shape == m.shape
    blocks_ = 37 * (k // 32)  # no padding to 128 weights; the float16 scales become float32
    assert m8.data.nbytes == m8.nbytes == m.nbytes + blocks_ * (4 if name == "Q4_1" else 2)
    x = (rng.standard_normal((5, k)) * rng.choice([0.01, 1, 30], (5, 1))).astype(np.float32)
    out8, out = np.empty((5, 37), np.float32), np.empty((5, 37), np.float32)
    matmul(x, m8.arrays(), out8, ALL)
    matmul(x, m.arrays(), out, ALL)
    q, d = quantized_activations(x)
    exact = (q * np.repeat(d, 32, axis=1)) @ w.T  # float64 on the int8 activations
    magnitude = (np.abs(q) * np.repeat(d, 32, axis=1)) @ np.abs(w).T
    assert np.all(np.abs(out8 - exact) <= 1e-5 * magnitude + 1e-30)
    bound = (np.repeat(d, 32, axis=1) / 2) @ np.abs(w).T
    assert np.all(np.abs(out8 - out) <= bound + 1e-5 * magnitude + 1e-30)
    assert not np.array_equal(out8, out)  # a different numeric path, really
    for n in range(1, 5):  # fewer tokens (a lone one, 2 + a lone one, ...): the same bits
        part = np.empty((n, 37), np.float32)
        matmul(x[5 - n:], m8.arrays(), part, ALL)
        assert np.array_equal(part, out8[5 - n:]), n


def test_quantize_is_per_token_and_rounds_half_to_even():
    x = np.zeros((2, 64), np.float32)
    x[0, :32] = np.linspace(-1, 1, 32, dtype=np.float32)
    x[0, 5] = np.float32(127) * np.float32(2.5) / np.float32(127)  # amax 2.5: codes of 1/50.8
    x[1, 40] = np.float32(1e-40)  # subnormal: its inverse overflows -> a block of zeros
    xq, xf, xc, nb = int8.quantize(x)
    assert nb == 2
    q, d = quantized_activations(x[:1])
    assert xq[0, :16].tolist() == q[0, :16].astype(int).tolist()
    assert xq[0, 64:80].tolist() == q[0, 16:32].astype(int).tolist()
    assert xf[0, 0] == d[0, 0] and xf[0, 16] == d[0, 0] * np.float32(q[0, :32].sum())
    assert not xq[1].any() and not xf[1].any() and not xc[1].any()
    one, *_ = int8.quantize(x[:1])
    assert np.array_equal(one[0], xq[0])


@pytest.mark.bitwise
@pytest.mark.parametrize("block_type", list(INT8))
def test_int8_models_are_batch_invariant(kolibri_home, tmp_path, block_type):
    path = tmp_path / f"tiny-{block_type}.gguf"
    tiny_gguf(path, block_type, tied=block_type == "Q8_0")
    name, folder = cache.import_gguf(path)
    model = load_model(folder, name, numerics="int8", kernels=LEAN)
    assert model.numerics == "int8" and set(model.weights.storage()) == {INT8[block_type]}
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
    floats = load_model(folder, name, numerics="float32", kernels=LEAN).transformer
    ref = split_logits(floats, ids, [])
    # close to the float32 path: rounding an activation to 8 bits per 32-block (step max|x|/127)
    # moves a matmul's output by ~0.5% of its spread; nine chained matmuls (2 layers x 4, the
    # head) add up to a few percent, and no logit moves by more than a fifth of the spread
    rms = np.sqrt(np.mean((want - ref) ** 2))
    assert rms < 0.03 * ref.std() and np.abs(want - ref).max() < 0.2 * ref.std(), (
        rms / ref.std(), np.abs(want - ref).max() / ref.std())


def test_int8_speculative_output_equals_plain():
    config = replace(TINY, tie_word_embeddings=True)
    for seed in range(3):
        weights = int8_weights(random_weights(config, seed=seed, scale=0.1, storage="q8_0"))
        assert set(weights.storage()) == {"Q8_0x8"}
        model = SimpleNamespace(transformer=Transformer(config, weights), eos_ids=(0,),
                                tokenizer=_Tok())
        accepted = 0
        for prompt in ([5, 6, 7] * 6, [9, 3, 9, 3, 1], list(range(1, 40))):
            plain = generate_plain(model, prompt, 40)
            spec = generate_spec(model, prompt, 40, NgramProposer(5, 1, 4))
            assert spec.output_ids == plain.output_ids
            accepted += spec.spec_stats()["drafts_accepted"]
        assert accepted > 0


_PORTABLE = """
import sys
import numpy as np
from kolibri_cli.engine import simd
from kolibri_cli.engine.model import load_model
assert not simd.VNNI
model = load_model(__import__('pathlib').Path(sys.argv[1]), 'tiny', numerics='int8',
                   kernels=('lean',))
ids = np.arange(40) % model.config.vocab_size
np.save(sys.argv[2], model.transformer.forward(ids, 0, model.transformer.new_cache(40)))
"""


@pytest.mark.bitwise
def test_portable_integer_dots_give_the_vnni_bits(kolibri_home, tmp_path):
    """Without VNNI the same integers come from widened multiplies (a process with its own
    numba cache, as another CPU would run)."""
    if not simd.VNNI:
        pytest.skip("this CPU runs the portable path already")
    path = tmp_path / "tiny-Q4_1.gguf"
    tiny_gguf(path, "Q4_1", tied=True)
    name, folder = cache.import_gguf(path)
    model = load_model(folder, name, numerics="int8", kernels=LEAN)
    ids = np.arange(40) % model.config.vocab_size
    want = model.transformer.forward(ids, 0, model.transformer.new_cache(40))
    env = os.environ | {"KOLIBRI_SIMD": "portable", "NUMBA_CACHE_DIR": str(tmp_path / "nc")}
    out = tmp_path / "portable.npy"
    proc = subprocess.run([sys.executable, "-c", _PORTABLE, str(folder), str(out)], env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert np.array_equal(np.load(out), want)


def _int8_types(kind, layer, n_layers):
    """Q4_1 and Q8_0 each on rows of 576 and of 1504 weights (a fused matrix one type)"""
    if kind in ("attn_q", "attn_k", "attn_v", "output"):
        return "Q4_1"
    if kind in ("attn_output", "token_embd"):
        return "Q8_0"
    gate_up, down = ("Q8_0", "Q4_1") if layer == 0 else ("Q4_1", "Q8_0")
    return down if kind == "ffn_down" else gate_up


@pytest.mark.bitwise
def test_avx2_build_gives_the_host_integers(kolibri_home, tmp_path):
    """kolibri compiled for an AVX2 CPU (no VNNI: widened multiplies; the rows' tails of 2 and 3
    blocks loaded masked, without AVX-512's masked loads) gives bitwise the logits of this
    host's VNNI build, for every L kind (1, the verify passes 2..6, prefill)."""
    if not simd.VNNI:
        pytest.skip("this CPU runs the code without AVX-512 already")
    path = tmp_path / "tiny-int8.gguf"
    # rows of 576 and 1504 weights: 4 and 11 super-blocks, then tails of 2 and 3 blocks
    tiny_gguf(path, _int8_types, d=576, ff=1504, heads=9, kv_heads=3, vocab=301)
    name, folder = cache.import_gguf(path)
    model = load_model(folder, name, numerics="int8", kernels=LEAN)
    assert set(model.weights.storage()) == {"Q4_1x8", "Q8_0x8"}
    ids = np.random.default_rng(6).integers(0, model.config.vocab_size, 60)
    cuts = [1, 2, 4, 7, 11, 16, 22]
    want = split_logits(model.transformer, ids, cuts)
    assert np.isfinite(want).all() and want.std() > 0
    got = avx2_split_logits(folder, "int8", ids, cuts, tmp_path)
    assert got.dtype == np.float32 and np.array_equal(got, want)


INT8_GOLDENS = Path(__file__).parent / "data" / "chat.int8.jsonl"


@pytest.mark.model
def test_default_model_int8_path_equals_its_own_goldens_and_spec_equals_plain(pulled_default):
    """The default model on the int8 path reproduces the goldens it recorded (`kolibri goldens
    record --engine kolibri --quantize int8 --greedy`), plain and speculative."""
    from kolibri_cli.store.models import open_model

    model = open_model(str(pulled_default.path), numerics="int8", kernels=LEAN)
    assert model.weights.storage() == {"Q4_1x8": 120, "Q8_0x8": 1}
    goldens = load_goldens(INT8_GOLDENS)
    assert len(goldens) == 18 and {g.reference["dtype"] for g in goldens} == {"int8"}
    accepted = 0
    for i, g in enumerate(goldens):
        assert check_one(model, g).identical, g.id
        if i % 3 == 0:
            spec = generate_spec(model, g.prompt_ids, len(g.output_ids), NgramProposer(5, 1, 4))
            assert spec.output_ids == g.output_ids, g.id
            accepted += spec.spec_stats()["drafts_accepted"]
    assert accepted > 0
