"""The forward kernel: each op against a naive float64 numpy reference, the whole forward against a
naive reference forward (and transformers when installed), and the batch-invariance law — a
position's logits are bitwise equal however the tokens are split into calls."""

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from kolibri_cli.engine import attention, kernel, matmul, rope
from kolibri_cli.engine.config import ModelConfig, RopeScaling
from kolibri_cli.engine.kernel import KVCache, Transformer
from kolibri_cli.engine.simd import vlane
from kolibri_cli.engine.weights import float_matrix, random_weights
from kolibri_cli.errors import KolibriError

TINY = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=10000.0,
                   max_position_embeddings=128)
# odd shapes: rows not a multiple of the block size R, D != H*Dh, one KV head for 6 query heads
ODD = ModelConfig(vocab_size=203, hidden_size=40, intermediate_size=52, num_hidden_layers=3,
                  num_attention_heads=6, num_key_value_heads=1, head_dim=8, rope_theta=500.0,
                  rms_norm_eps=1e-6, max_position_embeddings=96, tie_word_embeddings=True)
SMOL2 = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=2,
                    num_attention_heads=9, num_key_value_heads=3, head_dim=64, rope_theta=100000.0,
                    max_position_embeddings=8192, tie_word_embeddings=True)


def rand(rng, *shape, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(np.float32)


def rows(*ws):
    """Float32 weight rows (stacked) as the kernel's matrix tuple"""
    return float_matrix(list(ws)).arrays()


# ---------------------------------------------------------------- naive float64 references


def ref_rmsnorm(x, w, eps):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def ref_rope(x, pos, theta):
    """x [L, n_heads, Dh] at positions pos [L] -> rotate-half RoPE (float64)"""
    dh = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, dh, 2) / dh)
    ang = np.asarray(pos, np.float64)[:, None] * inv[None, :]  # [L, Dh/2]
    cos = np.concatenate([np.cos(ang)] * 2, -1)[:, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, -1)[:, None, :]
    rot = np.concatenate([-x[..., dh // 2:], x[..., :dh // 2]], -1)
    return x * cos + rot * sin


def ref_attention(q, k, v, start, window=0):
    """q [L, H, Dh], k/v [KVH, T, Dh] with T >= start+L -> [L, H*Dh], causal, GQA (float64);
    window > 0: each row sees its last `window` positions only"""
    n_tok, n_heads, dh = q.shape
    group = n_heads // k.shape[0]
    out = np.zeros((n_tok, n_heads, dh))
    for j in range(n_tok):
        n = start + j + 1
        lo = max(0, n - window) if window else 0
        for h in range(n_heads):
            s = k[h // group, lo:n].astype(np.float64) @ q[j, h] / np.sqrt(dh)
            p = np.exp(s - s.max())
            out[j, h] = (p / p.sum()) @ v[h // group, lo:n]
    return out.reshape(n_tok, -1)


def ref_qkv(config, lw, x):
    """x [L, D] -> q [L, H, Dh], k/v [L, KVH, Dh] before RoPE: biases, per-head norms (float64)"""
    c = config
    H, KVH, Dh = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    qkv = x @ lw.wqkv.to_float32().T.astype(np.float64) + (lw.bqkv if c.qkv_bias else 0.0)
    q = qkv[:, :H * Dh].reshape(-1, H, Dh)
    k = qkv[:, H * Dh:(H + KVH) * Dh].reshape(-1, KVH, Dh)
    if c.qk_norm:
        q, k = ref_rmsnorm(q, lw.q_norm, c.rms_norm_eps), ref_rmsnorm(k, lw.k_norm, c.rms_norm_eps)
    return q, k, qkv[:, (H + KVH) * Dh:].reshape(-1, KVH, Dh)


def ref_forward(config, weights, ids):
    """Logits [L, V] of a fresh prefill, float64, straight from the formulas."""
    c = config
    pos = np.arange(len(ids))
    h = weights.embed.to_float32()[ids].astype(np.float64)
    for i, lw in enumerate(weights.layers):
        q, k, v = ref_qkv(c, lw, ref_rmsnorm(h, lw.attn_norm, c.rms_norm_eps))
        q, k = ref_rope(q, pos, c.rope_theta), ref_rope(k, pos, c.rope_theta)
        att = ref_attention(q, k.transpose(1, 0, 2), v.transpose(1, 0, 2), 0, c.layer_window(i))
        h = h + att @ lw.wo.to_float32().T
        w_gate_up, w_down = lw.w_gate_up.to_float32(), lw.w_down.to_float32()
        gu = ref_rmsnorm(h, lw.mlp_norm, c.rms_norm_eps) @ w_gate_up.T.astype(np.float64)
        g, u = gu[:, :c.intermediate_size], gu[:, c.intermediate_size:]
        h = h + (g / (1 + np.exp(-g)) * u) @ w_down.T
    head = weights.head.to_float32()
    return ref_rmsnorm(h, weights.norm, c.rms_norm_eps) @ head.T.astype(np.float64)


# ---------------------------------------------------------------- ops


@pytest.mark.parametrize("n_rows", [1, 7, 8, 37, 64])
@pytest.mark.parametrize("n_tok", [1, 3, 9])
def test_matmul_matches_reference(n_rows, n_tok):
    rng = np.random.default_rng(n_rows * 10 + n_tok)
    x, w = rand(rng, n_tok, 48), rand(rng, n_rows, 48)
    out = np.full((n_tok, n_rows), np.nan, np.float32)  # NaN: a row no tile writes fails
    matmul.matmul(x, rows(w), out, matmul.ALL)
    np.testing.assert_allclose(out, x.astype(np.float64) @ w.T, rtol=1e-5, atol=1e-5)


def test_matmul_add_and_gate_up_silu():
    rng = np.random.default_rng(1)
    x, wo, h = rand(rng, 5, 40), rand(rng, 20, 40), rand(rng, 5, 20)
    expect = h + x.astype(np.float64) @ wo.T
    matmul.matmul_add(x, rows(wo), np.empty_like(h), h, matmul.ALL)
    np.testing.assert_allclose(h, expect, rtol=1e-5, atol=1e-5)
    n_ff = 13
    w = rand(rng, 2 * n_ff, 40)
    act = np.empty((5, n_ff), np.float32)
    matmul.gate_up_silu(x, rows(w[:n_ff], w[n_ff:]), np.empty((5, 2 * n_ff), np.float32), act,
                        matmul.ALL)
    gu = x.astype(np.float64) @ w.T
    g, u = gu[:, :n_ff], gu[:, n_ff:]
    np.testing.assert_allclose(act, g / (1 + np.exp(-g)) * u, rtol=1e-5, atol=1e-5)


def test_rmsnorm_matches_reference():
    rng = np.random.default_rng(2)
    x, w = rand(rng, 4, 576, scale=3.0), rand(rng, 576)
    out = np.empty_like(x)
    attention.rmsnorm(x, w, np.float32(1e-5), out)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, ref_rmsnorm(x, w, 1e-5), rtol=1e-5, atol=1e-5)


def test_rope_and_cache_write_match_reference():
    rng = np.random.default_rng(3)
    n_heads, n_kv, dh, start, n_tok = 4, 2, 16, 5, 3
    qkv = rand(rng, n_tok, (n_heads + 2 * n_kv) * dh)
    cache = KVCache(1, n_kv, 16, dh)
    cos, sin = rope.rope_tables(TINY, 16)
    q = np.empty((n_tok, n_heads, dh), np.float32)
    attention.qkv_to_cache(qkv, start, n_heads, cache.k[0], cache.v[0], cos, sin, q,
                           np.zeros(0, np.int64))  # a chain
    pos = np.arange(start, start + n_tok)
    q_ref = ref_rope(qkv[:, :n_heads * dh].reshape(n_tok, n_heads, dh).astype(np.float64), pos, 1e4)
    k_ref = ref_rope(qkv[:, n_heads * dh:(n_heads + n_kv) * dh].reshape(n_tok, n_kv, dh), pos, 1e4)
    np.testing.assert_allclose(q, q_ref, rtol=1e-5, atol=1e-5)
    k_got = cache.k[0][:, start:start + n_tok]  # [KVH, L, Dh]
    np.testing.assert_allclose(k_got, k_ref.transpose(1, 0, 2), rtol=1e-5, atol=1e-5)
    v_ref = qkv[:, (n_heads + n_kv) * dh:].reshape(n_tok, n_kv, dh).transpose(1, 0, 2)
    assert np.array_equal(cache.v[0][:, start:start + n_tok], v_ref)
    assert not cache.k[0][:, :start].any()  # earlier positions untouched


@pytest.mark.parametrize("n_heads,n_kv", [(4, 2), (6, 1), (3, 3)])
def test_attention_gqa_causal_at_offset(n_heads, n_kv):
    rng = np.random.default_rng(4)
    dh, start, n_tok, t_max = 16, 7, 4, 20
    q, k, v = rand(rng, n_tok, n_heads, dh), rand(rng, n_kv, t_max, dh), rand(rng, n_kv, t_max, dh)
    k[:, start + n_tok:] = np.nan  # beyond the causal window: must never be read
    out = np.empty((n_tok, n_heads * dh), np.float32)
    attention.attention(q, start, k, v, out)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, ref_attention(q, k, v, start), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- whole forward


@pytest.mark.parametrize("config", [TINY, ODD], ids=["tiny", "odd"])
def test_forward_matches_reference_forward(config):
    model = Transformer(config, random_weights(config, seed=5, scale=0.2))
    ids = np.random.default_rng(6).integers(0, config.vocab_size, 23)
    cache = model.new_cache()
    logits = model.forward(ids, 0, cache)
    assert logits.dtype == np.float32 and logits.shape == (23, config.vocab_size)
    assert cache.k.dtype == cache.v.dtype == np.float32 and cache.length == 23
    ref = ref_forward(config, model.weights, ids)
    assert np.abs(logits - ref).max() < 1e-4 * max(1.0, np.abs(ref).max())


def test_head_may_differ_from_embed():
    model = Transformer(TINY, random_weights(TINY, seed=7, scale=0.2))
    assert model.weights.head is not model.weights.embed  # TINY is untied
    logits = model.forward([3, 1, 4], 0, model.new_cache(8))
    assert np.abs(logits - ref_forward(TINY, model.weights, [3, 1, 4])).max() < 1e-4


@st.composite
def shapes(draw):
    """Any small decoder: odd widths, 1-layer, MQA to MHA, windows inside and beyond the
    context, biases and q/k norms, vocabularies down to one token."""
    n_kv, group = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    n_layers = draw(st.integers(1, 3))
    return ModelConfig(
        vocab_size=draw(st.integers(1, 300)), hidden_size=draw(st.integers(1, 70)),
        intermediate_size=draw(st.integers(1, 90)), num_hidden_layers=n_layers,
        num_attention_heads=n_kv * group, num_key_value_heads=n_kv,
        head_dim=2 * draw(st.integers(1, 17)), rope_theta=draw(st.sampled_from([1e2, 1e4, 1e6])),
        max_position_embeddings=draw(st.integers(1, 48)),
        tie_word_embeddings=draw(st.booleans()), qkv_bias=draw(st.booleans()),
        qk_norm=draw(st.booleans()), sliding_window=draw(st.integers(0, 60)),
        sliding_layers=tuple(i for i in range(n_layers) if draw(st.booleans())))


@settings(max_examples=60, deadline=None)
@given(config=shapes(), data=st.data())
def test_any_shape_matches_the_reference_in_any_split(config, data):
    """The kernel indexes without bounds checks: every shape must stay in bounds (the CI runs
    this with NUMBA_BOUNDSCHECK=1) and compute the formulas, however the tokens are split."""
    model = Transformer(config, random_weights(config, seed=data.draw(st.integers(0, 99)),
                                               scale=0.3))
    n = data.draw(st.integers(1, config.max_position_embeddings))
    ids = np.array(data.draw(st.lists(st.integers(0, config.vocab_size - 1), min_size=n,
                                      max_size=n)))
    cuts = data.draw(st.lists(st.integers(1, max(1, n - 1)), max_size=4, unique=True))
    got = run_split(model, ids, sorted(c for c in cuts if c < n))
    ref = ref_forward(config, model.weights, ids)
    assert got.dtype == np.float32 and got.shape == (n, config.vocab_size)
    assert np.abs(got - ref).max() < 1e-4 * max(1.0, np.abs(ref).max())


# ---------------------------------------------------------------- batch invariance


def run_split(model, ids, cuts):
    """Feed ids in chunks ending at `cuts`; return all rows of logits stacked [N, V]."""
    cache, rows, pos = model.new_cache(len(ids)), [], 0
    for end in [*cuts, len(ids)]:
        if end > pos:
            rows.append(model.forward(ids[pos:end], pos, cache))
            pos = end
    return np.concatenate(rows)


def random_cuts(rng, n):
    n_cuts = rng.integers(1, min(n - 1, 8) + 1)
    return sorted(rng.choice(np.arange(1, n), size=n_cuts, replace=False))


@pytest.mark.bitwise
@pytest.mark.parametrize("config", [TINY, ODD], ids=["tiny", "odd"])
def test_prefill_equals_decode_equals_any_split(config):
    model = Transformer(config, random_weights(config, seed=8, scale=0.2))
    rng = np.random.default_rng(9)
    ids = rng.integers(0, config.vocab_size, 40)
    prefill = run_split(model, ids, [])
    decode = run_split(model, ids, list(range(1, 40)))
    assert np.array_equal(prefill, decode)
    for _ in range(12):
        assert np.array_equal(prefill, run_split(model, ids, random_cuts(rng, 40)))


@pytest.mark.bitwise
@pytest.mark.parametrize("storage", ["float32", "q8_0"])
def test_long_prefill_equals_any_split(storage):
    """A prompt longer than a token block (matmul.TB) as one call, as decode steps, and cut at
    random points: bitwise the same logits."""
    config = ODD if storage == "float32" else TINY  # ODD's widths are not multiples of 32
    config = replace(config, max_position_embeddings=256)
    model = Transformer(config, random_weights(config, seed=20, scale=0.2, storage=storage))
    rng = np.random.default_rng(21)
    n = 2 * matmul.TB + 27
    ids = rng.integers(0, config.vocab_size, n)
    prefill = run_split(model, ids, [])
    assert np.array_equal(prefill, run_split(model, ids, list(range(1, n))))
    for _ in range(4):
        assert np.array_equal(prefill, run_split(model, ids, random_cuts(rng, n)))


@pytest.mark.bitwise
def test_every_chunk_length_1_to_16_after_any_prefix():
    """The verify pattern: a prefix, then one call of L tokens, for every L 1..16."""
    model = Transformer(TINY, random_weights(TINY, seed=10, scale=0.2))
    ids = np.random.default_rng(11).integers(0, TINY.vocab_size, 40)
    alone = run_split(model, ids, list(range(1, 40)))
    for start in (0, 1, 5, 13):
        for n in range(1, 17):
            cache = model.new_cache(40)
            if start:
                model.forward(ids[:start], 0, cache)
            got = model.forward(ids[start:start + n], start, cache)
            assert np.array_equal(got, alone[start:start + n])


@pytest.mark.bitwise
def test_matmul_rows_independent_of_call_size():
    rng = np.random.default_rng(12)
    x, w = rand(rng, 16, 576), rows(rand(rng, 203, 576))
    alone = np.empty((16, 203), np.float32)
    for j in range(16):
        matmul.matmul(x[j:j + 1], w, alone[j:j + 1], matmul.ALL)
    for n in range(1, 17):
        for s in range(0, 17 - n):
            out = np.empty((n, 203), np.float32)
            matmul.matmul(x[s:s + n], w, out, matmul.ALL)
            assert np.array_equal(out, alone[s:s + n])


@njit
def _tile_lanes(w, kp, x, xo, jn):
    """matmul._tile's 16 lanes as an array (lane 4i + j = row i . token j)"""
    s = matmul._tile(w, kp, x, xo, jn)
    return np.array([vlane(s, i) for i in range(16)], np.float32)


@pytest.mark.bitwise
def test_register_tiles_round_alike():
    """The decode dot and the 4 x 1..4 register tiles give bitwise equal dots, for widths that
    are and are not multiples of 32 (float rows are zero-padded)."""
    rng = np.random.default_rng(19)
    for k_dim in (576, 1536, 40, 7):
        m = float_matrix([rand(rng, 4, k_dim)])
        x = matmul._padded(rand(rng, 4, k_dim))
        kp = x.shape[1]
        w = np.concatenate([m.to_float32(), np.zeros((4, kp - k_dim), np.float32)], 1).ravel()
        wide = {jn: _tile_lanes(w, kp, x.ravel(), 0, jn).reshape(4, 4)[:, :jn] for jn in (2, 3, 4)}
        for j in range(4):
            one = np.empty(4, np.float32)
            matmul._decode_unit(m.data, m.units[0], x[j], one, matmul.ALL)
            assert one.any()
            assert np.array_equal(one, _tile_lanes(w, kp, x.ravel(), j * kp, 1).reshape(4, 4)[:, 0])
            for jn in (2, 3, 4):
                if j < jn:
                    assert np.array_equal(one, wide[jn][:, j]), (k_dim, j, jn)


@pytest.mark.bitwise
def test_rollback_then_continue_equals_plain():
    """A rejected draft leaves stale K/V past `length`; overwriting them gives plain logits."""
    model = Transformer(TINY, random_weights(TINY, seed=13, scale=0.2))
    ids = np.random.default_rng(14).integers(0, TINY.vocab_size, 20)
    plain = run_split(model, ids, list(range(1, 20)))
    cache = model.new_cache(32)
    model.forward(ids[:10], 0, cache)
    model.forward([7, 7, 7, 7, 7], 10, cache)  # a wrong draft
    cache.length = 10
    assert np.array_equal(model.forward(ids[10:20], 10, cache), plain[10:20])


@pytest.mark.bitwise
def test_smollm2_shapes_invariant_and_close_to_reference():
    model = Transformer(SMOL2, random_weights(SMOL2, seed=15))
    rng = np.random.default_rng(16)
    ids = rng.integers(0, SMOL2.vocab_size, 12)
    prefill = run_split(model, ids, [])
    assert np.array_equal(prefill, run_split(model, ids, list(range(1, 12))))
    assert np.array_equal(prefill, run_split(model, ids, [3, 9]))
    ref = ref_forward(SMOL2, model.weights, ids)
    assert np.abs(prefill - ref).max() < 1e-4 * max(1.0, np.abs(ref).max())


@pytest.mark.bitwise
def test_long_prefill_split_anywhere_equals_one_call():
    """Past kernel.CHUNK tokens a forward runs in chunks and the RoPE tables grow; neither may
    show in the bits: 700 tokens in one call, one at a time, split at random points, and the
    prefill row all agree."""
    long = replace(TINY, max_position_embeddings=2048)
    model = Transformer(long, random_weights(long, seed=20, scale=0.2))
    rng = np.random.default_rng(21)
    ids = rng.integers(0, long.vocab_size, 700)
    whole = run_split(model, ids, [])
    assert np.array_equal(whole, run_split(model, ids, list(range(1, 700))))
    for _ in range(4):
        assert np.array_equal(whole, run_split(model, ids, random_cuts(rng, 700)))
    cache = model.new_cache(700)
    assert np.array_equal(model.prefill(ids, 0, cache), whole[-1]) and cache.length == 700


@pytest.mark.bitwise
@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 16])
def test_chunk_boundaries_do_not_show(monkeypatch, chunk):
    model = Transformer(ODD, random_weights(ODD, seed=23, scale=0.2))
    ids = np.random.default_rng(24).integers(0, ODD.vocab_size, 40)
    whole = run_split(model, ids, [])
    monkeypatch.setattr(kernel, "CHUNK", chunk)
    assert np.array_equal(run_split(model, ids, [5, 17]), whole)
    cache = model.new_cache(40)
    model.forward(ids[:9], 0, cache)
    assert np.array_equal(model.prefill(ids[9:], 9, cache), whole[-1])


def test_rope_tables_are_prefixes_of_longer_tables():
    """Tables grow on demand: a position's cos/sin must not depend on the table's length."""
    yarn = replace(TINY, head_dim=6, rope_scaling=RopeScaling(
        rope_type="yarn", factor=4.0, original_max_position_embeddings=64))
    for config in (TINY, ODD, yarn):
        cos, sin = rope.rope_tables(config, 5000)
        for n in (1, 7, 256, 257, 1000, 4097):
            small_cos, small_sin = rope.rope_tables(config, n)
            assert np.array_equal(small_cos, cos[:n]) and np.array_equal(small_sin, sin[:n])


def test_rope_tables_cover_the_positions_used_not_the_context():
    """A 2e7-position context took 22 s and 5.7 GB of tables before the first token."""
    huge = replace(TINY, max_position_embeddings=20_000_000)
    model = Transformer(huge, random_weights(huge, seed=25, scale=0.2))
    assert model._cos.shape[0] <= kernel.CHUNK
    model.forward(np.arange(300) % huge.vocab_size, 0, model.new_cache(300))
    assert 300 <= model._cos.shape[0] == model._sin.shape[0] <= 1024


PREFILL_PEAK = """
import resource
from types import SimpleNamespace
import numpy as np
from kolibri_cli.decode.generate import generate_plain
from kolibri_cli.engine.config import ModelConfig, RopeScaling
from kolibri_cli.engine.kernel import Transformer
from kolibri_cli.engine.weights import random_weights
c = ModelConfig(vocab_size=32000, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                max_position_embeddings=4096)
model = SimpleNamespace(transformer=Transformer(c, random_weights(c)), eos_ids=(),
                        tokenizer=SimpleNamespace(decode=str))
ids = np.random.default_rng(0).integers(0, c.vocab_size, 4000).tolist()
generate_plain(model, ids[:300], 1)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
generate_plain(model, ids, 1)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


def test_prefill_peak_memory_does_not_grow_with_prompt_length_squared():
    """A 4000-token prefill of a 32k-vocabulary model: [L, V] logits would be 512 MB and
    [L*H, T] attention scores 256 MB per layer; bounded, the peak grows by the KV cache (1 MB)
    and per-chunk buffers."""
    run = [sys.executable, "-c", PREFILL_PEAK]
    subprocess.run(run, capture_output=True, timeout=900)  # compiling peaks higher: not in there
    out = subprocess.run(run, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout) < 64 * 1024  # KiB


def _mapping(address: int) -> dict[str, int]:
    """The /proc/self/smaps fields (kB) of the mapping holding `address`."""
    fields, inside = {}, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and line.split()[-1] == "kB":
            fields[head.rstrip(":")] = int(line.split()[1])
    return fields


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux /proc")
def test_kv_cache_commits_only_the_pages_written():
    """numpy backs big arrays with transparent huge pages: the first write into each (layer,
    head) block then committed 2 MiB (here 4 blocks x 2 MiB for 2 positions)."""
    config = replace(TINY, max_position_embeddings=1 << 16)  # blocks of 4 MiB
    model = Transformer(config, random_weights(config, seed=26, scale=0.2))
    cache = model.new_cache()
    model.forward([1, 2], 0, cache)
    k = _mapping(cache.k.ctypes.data)
    assert k["Size"] >= cache.k.nbytes // 1024
    assert k["Rss"] < 1024 and k.get("AnonHugePages", 0) == 0


def test_kv_cache_larger_than_the_address_space_is_an_error():
    huge = replace(TINY, max_position_embeddings=1 << 42)  # 2^50 bytes of keys
    with pytest.raises(KolibriError, match="cannot reserve"):
        Transformer(huge, random_weights(huge)).new_cache()


# ---------------------------------------------------------------- errors


def test_errors_are_kolibri_errors():
    model = Transformer(TINY, random_weights(TINY, seed=17))
    cache = model.new_cache(8)
    with pytest.raises(KolibriError, match="exceed the KV cache"):
        model.forward(list(range(9)), 0, cache)
    model.forward([1, 2, 3], 0, cache)
    with pytest.raises(KolibriError, match="exceed the KV cache"):
        model.forward([1] * 6, 3, cache)
    with pytest.raises(KolibriError, match="start_pos"):
        model.forward([1], 5, cache)
    with pytest.raises(KolibriError, match="token ids"):
        model.forward([TINY.vocab_size], 3, cache)
    with pytest.raises(KolibriError, match="at least one"):
        model.forward([], 3, cache)
    with pytest.raises(KolibriError, match="cache length"):
        model.new_cache(TINY.max_position_embeddings + 1)
    with pytest.raises(KolibriError, match="does not fit this model"):
        model.forward([1], 0, Transformer(ODD, random_weights(ODD)).new_cache(8))
    with pytest.raises(KolibriError, match="does not fit this model"):
        model.forward([1], 0, KVCache(2, 2, TINY.max_position_embeddings + 1, 16))
    assert cache.length == 3  # failed calls change nothing


def test_new_cache_defaults_to_context_length():
    model = Transformer(TINY, random_weights(TINY))
    cache = model.new_cache()
    assert cache.k.shape == (2, 2, TINY.max_position_embeddings, 16) and cache.length == 0


# ---------------------------------------------------------------- transformers


def hf_model(seed=0):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    hf_config = transformers.LlamaConfig(
        vocab_size=1000, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
        attn_implementation="eager", torch_dtype=torch.float32)
    hf = transformers.LlamaForCausalLM(hf_config).eval()
    with torch.no_grad():  # non-trivial norm weights, so a missing norm weight would show
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
    return hf


def from_hf(hf):
    from kolibri_cli.engine.weights import layout

    config = ModelConfig.from_dict(hf.config.to_dict() | {"architectures": ["LlamaForCausalLM"]})
    tensors = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    return Transformer(config, layout(config, tensors))


def test_logits_match_transformers():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    hf = hf_model()
    model = from_hf(hf)
    ids = np.random.default_rng(18).integers(0, 1000, 50)
    with torch.no_grad():
        expect = hf(torch.tensor(ids[None])).logits[0].numpy()
    got = run_split(model, ids, [20, 21, 27])
    assert np.abs(got - expect).max() < 1e-4


def test_greedy_ids_match_transformers():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    hf = hf_model(seed=1)
    model = from_hf(hf)
    prompt = [5, 17, 923, 4, 4, 88]
    seq = list(prompt)
    with torch.no_grad():  # a plain loop: generate() applies eos/min-length logits processors
        for _ in range(32):
            seq.append(int(hf(torch.tensor([seq])).logits[0, -1].argmax()))
    hf_ids = seq[len(prompt):]
    cache = model.new_cache(len(prompt) + 32)
    ids = [int(model.forward(prompt, 0, cache)[-1].argmax())]
    while len(ids) < 32:
        ids.append(int(model.forward(ids[-1:], len(prompt) + len(ids) - 1, cache)[0].argmax()))
    assert ids == hf_ids


# ---------------------------------------------------------------- bench helpers (no timed asserts)


def test_bench_helpers_shapes():
    from kolibri_cli.bench import timing as bench
    from kolibri_cli.costs import timing

    model = Transformer(TINY, random_weights(TINY))
    assert bench.measure_read_bandwidth(nbytes=1 << 20, repeats=2) > 0
    c = timing.verify_costs(model, 4, context_len=10, repeats=2)
    assert sorted(c) == [1, 2, 3, 4] and c[1] == 1.0
