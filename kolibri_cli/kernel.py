"""The forward kernel: a Llama-family decoder in float32 numba, batch-invariant by construction.

Scope: one `Transformer.forward(tokens, start_pos, cache) -> logits [L, V]` serves prefill, 1-token
decode and multi-token speculative verify. It computes exactly what Hugging Face transformers'
LlamaForCausalLM computes (RMSNorm, rotate-half RoPE, grouped-query causal attention, SwiGLU MLP,
final norm, output head), in float32, with a KV cache indexed by position (rollback = set
`cache.length`, never copy). The Mistral/Qwen2/Qwen3 variants are switches inside the same
kernel, driven by the config and the weights: q/k/v biases and per-head q/k RMSNorm are
zero-length arrays when absent (one `.shape[0]` test per layer), a sliding window is a per-layer
int (0 = whole context), and RoPE scaling (linear, llama3, yarn) only changes the cos/sin tables.

Batch invariance: a position's logits are bitwise identical whatever L is and wherever the row
falls in the call. BLAS is never used (GEMM and GEMV round differently). Every dot product is one
vectorized loop over the input dimension (fastmath `reassoc` on reductions only), and LLVM is told
not to interleave vectorized loops, so each sum gets exactly one accumulator vector: the 1-, 2- and
3-token register tiles of the matmul then round every (row, token) dot alike, and no tiling of L
changes a bit. Norms and attention work one token row at a time; elementwise ops are strict IEEE.
The tests assert all of this with `array_equal` for every L 1..16 and random splits.

Speed: matmuls run parallel over units of R weight rows strided across the matrix (R long
sequential streams per thread for the prefetcher); a unit's rows stay in L1/L2 while the L tokens
pass in register tiles, so an L-token forward reads the weights from memory once. Each layer is
five parallel regions plus a little serial work on the calling thread; the whole stack is one
compiled call (`cache=True`: compiled once per machine, ~11 s, then ~0.02 s to load).

Non-goals: quantized weights, float16/bfloat16, batches of independent sequences, sampling,
dynamic/longrope RoPE, I/O of any kind (the caller loads weights).
"""

import math
import os

import llvmlite.binding as llvm
import numba
import numpy as np
from numba import njit, prange
from numba.typed import List

from kolibri_cli.config import ModelConfig
from kolibri_cli.errors import KolibriError
from kolibri_cli.weights import Weights

# libgomp reads this once, when numba starts its OpenMP threads (the first parallel call, not an
# import). Its default spins each idle thread ~300k times at each of the ~150 barriers per forward:
# with another process busy on one core, 2 threads then took ~1.1 s per token instead of 12 ms.
# 1000 spins cost nothing measurable on an idle machine and keep a busy one at ~30 ms per token.
# A value set in the environment wins.
os.environ.setdefault("GOMP_SPINCOUNT", "1000")

REDUCE = {"reassoc", "contract"}  # fastmath for reductions only: no nnan/ninf/afn
R = 8  # weight rows per unit of parallel work
R1 = 4  # ... when L == 1: fewer streams per thread, measured ~10% faster decode
ONE = np.float32(1.0)
ZERO = np.float32(0.0)

# Every vectorized reduction loop gets one accumulator vector per sum (no interleaving), so the
# 1-, 2- and 3-token tiles below sum each dot product in the same order: which tile computes a
# row then cannot change its bits. Set before this module compiles anything; process-wide, but
# it only costs speed in other numba code, never results.
llvm.set_option("", "-force-vector-interleave=1")


def set_threads(n: int) -> None:
    """Use n threads for the parallel kernels (the `--threads` option)."""
    if n < 1 or n > numba.config.NUMBA_NUM_THREADS:
        raise KolibriError(f"--threads must be 1..{numba.config.NUMBA_NUM_THREADS}, got {n}")
    numba.set_num_threads(n)


def is_compiled() -> bool:
    """Whether numba's on-disk cache already holds the forward kernel (start-up is then fast)."""
    try:
        return os.path.isfile(_forward._cache._cache_file._index_path)
    except AttributeError:  # numba internals changed: assume compiled, say nothing
        return True


def get_threads() -> int:
    return numba.get_num_threads()


# ---------------------------------------------------------------- matmul: x @ w.T
# A unit of work is R weight rows r0 + i*step (i < R) for all L tokens. Striding the rows by
# step = N // R gives each thread R long sequential streams that the hardware prefetcher keeps
# ahead of; the tokens go through in register tiles of 3 (then 2 or 1), the unit's rows staying
# in L1/L2 between tiles, so an L-token matmul reads the weights from memory once.


@njit(fastmath=REDUCE, cache=True)
def _tile1(x, j, w, r0, step, out):
    """out[j, r0 + i*step] = x[j] . w[r0 + i*step] for i < R   x [L, K], w [N, K], out [L, N]"""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = ZERO
    for k in range(x.shape[1]):
        a = x[j, k]
        s0 += w[r0, k] * a
        s1 += w[r0 + step, k] * a
        s2 += w[r0 + 2 * step, k] * a
        s3 += w[r0 + 3 * step, k] * a
        s4 += w[r0 + 4 * step, k] * a
        s5 += w[r0 + 5 * step, k] * a
        s6 += w[r0 + 6 * step, k] * a
        s7 += w[r0 + 7 * step, k] * a
    for i, s in enumerate((s0, s1, s2, s3, s4, s5, s6, s7)):
        out[j, r0 + i * step] = s


@njit(fastmath=REDUCE, cache=True)
def _tile1_r1(x, w, r0, step, out):
    """_tile1 for token 0 and R1 = 4 rows (the decode path)"""
    s0 = s1 = s2 = s3 = ZERO
    for k in range(x.shape[1]):
        a = x[0, k]
        s0 += w[r0, k] * a
        s1 += w[r0 + step, k] * a
        s2 += w[r0 + 2 * step, k] * a
        s3 += w[r0 + 3 * step, k] * a
    for i, s in enumerate((s0, s1, s2, s3)):
        out[0, r0 + i * step] = s


@njit(fastmath=REDUCE, cache=True)
def _tile2(x, j, w, r0, step, out):
    """_tile1 for tokens j, j+1"""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = ZERO  # token j
    t0 = t1 = t2 = t3 = t4 = t5 = t6 = t7 = ZERO  # token j+1
    for k in range(x.shape[1]):
        a, b = x[j, k], x[j + 1, k]
        v = w[r0, k]
        s0 += v * a
        t0 += v * b
        v = w[r0 + step, k]
        s1 += v * a
        t1 += v * b
        v = w[r0 + 2 * step, k]
        s2 += v * a
        t2 += v * b
        v = w[r0 + 3 * step, k]
        s3 += v * a
        t3 += v * b
        v = w[r0 + 4 * step, k]
        s4 += v * a
        t4 += v * b
        v = w[r0 + 5 * step, k]
        s5 += v * a
        t5 += v * b
        v = w[r0 + 6 * step, k]
        s6 += v * a
        t6 += v * b
        v = w[r0 + 7 * step, k]
        s7 += v * a
        t7 += v * b
    for i, (s, t) in enumerate(((s0, t0), (s1, t1), (s2, t2), (s3, t3), (s4, t4), (s5, t5),
                                (s6, t6), (s7, t7))):
        out[j, r0 + i * step], out[j + 1, r0 + i * step] = s, t


@njit(fastmath=REDUCE, cache=True)
def _tile3(x, j, w, r0, step, out):
    """_tile1 for tokens j, j+1, j+2"""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = ZERO  # token j
    t0 = t1 = t2 = t3 = t4 = t5 = t6 = t7 = ZERO  # token j+1
    u0 = u1 = u2 = u3 = u4 = u5 = u6 = u7 = ZERO  # token j+2
    for k in range(x.shape[1]):
        a, b, c = x[j, k], x[j + 1, k], x[j + 2, k]
        v = w[r0, k]
        s0, t0, u0 = s0 + v * a, t0 + v * b, u0 + v * c
        v = w[r0 + step, k]
        s1, t1, u1 = s1 + v * a, t1 + v * b, u1 + v * c
        v = w[r0 + 2 * step, k]
        s2, t2, u2 = s2 + v * a, t2 + v * b, u2 + v * c
        v = w[r0 + 3 * step, k]
        s3, t3, u3 = s3 + v * a, t3 + v * b, u3 + v * c
        v = w[r0 + 4 * step, k]
        s4, t4, u4 = s4 + v * a, t4 + v * b, u4 + v * c
        v = w[r0 + 5 * step, k]
        s5, t5, u5 = s5 + v * a, t5 + v * b, u5 + v * c
        v = w[r0 + 6 * step, k]
        s6, t6, u6 = s6 + v * a, t6 + v * b, u6 + v * c
        v = w[r0 + 7 * step, k]
        s7, t7, u7 = s7 + v * a, t7 + v * b, u7 + v * c
    for i, (s, t, u) in enumerate(((s0, t0, u0), (s1, t1, u1), (s2, t2, u2), (s3, t3, u3),
                                   (s4, t4, u4), (s5, t5, u5), (s6, t6, u6), (s7, t7, u7))):
        out[j, r0 + i * step], out[j + 1, r0 + i * step], out[j + 2, r0 + i * step] = s, t, u


@njit(fastmath=REDUCE, cache=True)
def _row(x, w, r, out):
    """out[:, r] = x @ w[r]   (the N % R rows left over; always the same rows for a shape)"""
    for j in range(x.shape[0]):
        s = ZERO
        for k in range(x.shape[1]):
            s += w[r, k] * x[j, k]
        out[j, r] = s


@njit(cache=True)
def _unit_rows(n_rows, rows, b):
    """Unit b of an n_rows matrix cut in units of `rows` -> (first row, step, count):
    `rows` strided rows, or one leftover row."""
    n_blocks = n_rows // rows
    u = np.int64(b)  # prange indices may be unsigned; unsigned + signed would give float64
    if u < n_blocks:
        return u, n_blocks, rows
    return rows * n_blocks + u - n_blocks, 1, 1


@njit(cache=True)
def _n_units(n_rows, rows):
    return n_rows // rows + n_rows % rows


@njit(cache=True)
def _unit_size(x):
    """Rows per unit for x [L, K]: R1 for decode, R when tokens share the weight rows"""
    return R1 if x.shape[0] == 1 else R


@njit(cache=True)
def _unit(x, w, n_rows, offset, b, out):
    """out[:, rows] = x @ w[rows].T for the rows of unit b of w[offset:offset+n_rows]"""
    r0, step, count = _unit_rows(n_rows, _unit_size(x), b)
    if count == 1:
        _row(x, w, offset + r0, out)
        return
    if count == R1:
        _tile1_r1(x, w, offset + r0, step, out)
        return
    j = 0
    while j + 3 <= x.shape[0]:
        _tile3(x, j, w, offset + r0, step, out)
        j += 3
    if x.shape[0] - j == 2:
        _tile2(x, j, w, offset + r0, step, out)
    elif x.shape[0] - j == 1:
        _tile1(x, j, w, offset + r0, step, out)


@njit(parallel=True, cache=True)
def _matmul(x, w, out):
    """out = x @ w.T   x [L, K], w [N, K] -> out [L, N]"""
    for b in prange(_n_units(w.shape[0], _unit_size(x))):
        _unit(x, w, w.shape[0], 0, b, out)


@njit(parallel=True, cache=True)
def _matmul_add(x, w, tmp, h):
    """h += x @ w.T (the residual add fused in)   x [L, K], w [D, K], tmp/h [L, D]"""
    n_rows = w.shape[0]
    for b in prange(_n_units(n_rows, _unit_size(x))):
        _unit(x, w, n_rows, 0, b, tmp)
        r0, step, count = _unit_rows(n_rows, _unit_size(x), b)
        for j in range(x.shape[0]):
            for r in range(r0, r0 + count * step, step):
                h[j, r] += tmp[j, r]


@njit(cache=True)
def _silu(g):
    return g / (ONE + np.exp(-g))


@njit(parallel=True, cache=True)
def _gate_up_silu(x, w, gu, act):
    """act = silu(x @ gate.T) * (x @ up.T)
    x [L, D], w [2F, D] rows gate then up, gu [L, 2F] scratch -> act [L, F]"""
    n_ff = act.shape[1]
    for b in prange(_n_units(n_ff, _unit_size(x))):
        _unit(x, w, n_ff, 0, b, gu)
        _unit(x, w, n_ff, n_ff, b, gu)
        r0, step, count = _unit_rows(n_ff, _unit_size(x), b)
        for j in range(x.shape[0]):
            for r in range(r0, r0 + count * step, step):
                act[j, r] = _silu(gu[j, r]) * gu[j, n_ff + r]


# ---------------------------------------------------------------- norm, rope, attention


@njit(fastmath=REDUCE, cache=True)
def _sum_squares(x):
    """x [D] -> sum of x^2 (float32)"""
    s = ZERO
    for i in range(x.shape[0]):
        s += x[i] * x[i]
    return s


@njit(cache=True)
def _rmsnorm(x, w, eps, out):
    """out = x * rsqrt(mean(x^2) + eps) * w   x [L, D], w [D], out [L, D]"""
    d = np.float32(x.shape[1])
    for j in range(x.shape[0]):
        inv = ONE / np.sqrt(_sum_squares(x[j]) / d + eps)
        for i in range(x.shape[1]):
            out[j, i] = w[i] * (x[j, i] * inv)


@njit(cache=True)
def _add_bias(x, b):
    """x += b on every row   x [L, N], b [N]"""
    for j in range(x.shape[0]):
        for i in range(x.shape[1]):
            x[j, i] += b[i]


@njit(cache=True)
def _head_norms(qkv, n_heads, n_kv, q_norm, k_norm, eps):
    """RMSNorm over Dh of every q and k head in place (Qwen3), before RoPE.
    qkv [L, (H+2KVH)*Dh], q_norm/k_norm [Dh]"""
    dh = q_norm.shape[0]
    for j in range(qkv.shape[0]):
        for h in range(n_heads + n_kv):
            x = qkv[j:j + 1, h * dh:(h + 1) * dh]  # [1, Dh]
            _rmsnorm(x, q_norm if h < n_heads else k_norm, eps, x)


@njit(cache=True)
def _rope(x, cos, sin):
    """Rotate-half RoPE in place   x [Dh], cos/sin [Dh] (one position)"""
    half = x.shape[0] // 2
    for i in range(half):
        a, b = x[i], x[i + half]
        x[i] = a * cos[i] - b * sin[i]
        x[i + half] = b * cos[i + half] + a * sin[i + half]


@njit(cache=True)
def _qkv_to_cache(qkv, start, n_heads, k_cache, v_cache, cos, sin, q):
    """Split qkv, rope q and k, write k/v at their positions.
    qkv [L, (H+2KVH)*Dh], k_cache/v_cache [KVH, T, Dh], cos/sin [T, Dh] -> q [L, H, Dh]"""
    n_kv, _, dh = k_cache.shape
    for j in range(qkv.shape[0]):
        p = start + j
        for h in range(n_heads):
            q[j, h] = qkv[j, h * dh:(h + 1) * dh]
            _rope(q[j, h], cos[p], sin[p])
        for g in range(n_kv):
            k_cache[g, p] = qkv[j, (n_heads + g) * dh:(n_heads + g + 1) * dh]
            _rope(k_cache[g, p], cos[p], sin[p])
            v_cache[g, p] = qkv[j, (n_heads + n_kv + g) * dh:(n_heads + n_kv + g + 1) * dh]


@njit(fastmath=REDUCE, cache=True)
def _dot(a, b):
    """a [Dh], b [Dh] -> float32"""
    s = ZERO
    for i in range(a.shape[0]):
        s += a[i] * b[i]
    return s


@njit(fastmath=REDUCE, cache=True)
def _softmax_inplace(s):
    """s [T] scores -> probabilities (max-subtracted, float32, like torch.softmax)"""
    m = s[0]
    for t in range(1, s.shape[0]):
        m = max(m, s[t])
    total = ZERO
    for t in range(s.shape[0]):
        s[t] = np.exp(s[t] - m)
        total += s[t]
    for t in range(s.shape[0]):
        s[t] = s[t] / total


@njit(cache=True)
def _attend_one(q, k, v, scale, scores, out):
    """One query row against the T positions given   q [Dh], k/v [T, Dh], scores [T] -> out [Dh]"""
    for t in range(k.shape[0]):
        scores[t] = _dot(q, k[t]) * scale
    _softmax_inplace(scores)
    out[:] = ZERO
    for t in range(k.shape[0]):
        for i in range(out.shape[0]):
            out[i] += scores[t] * v[t, i]


@njit(parallel=True, cache=True)
def _attention(q, start, k_cache, v_cache, scores, out, window=0):
    """Causal GQA: row l attends to positions 0..start+l, or to the last `window` of them.
    q [L, H, Dh], k/v_cache [KVH, T, Dh], scores [L*H, start+L] -> out [L, H*Dh]"""
    n_q, n_heads, dh = q.shape
    group = n_heads // k_cache.shape[0]
    scale = np.float32(1.0 / np.sqrt(dh))
    for i in prange(n_q * n_heads):
        j, h = i // n_heads, i % n_heads
        n = start + j + 1
        lo = max(0, n - window) if window > 0 else 0  # transformers: kv > q - window
        g = h // group
        _attend_one(q[j, h], k_cache[g, lo:n], v_cache[g, lo:n], scale, scores[i, :n - lo],
                    out[j, h * dh:(h + 1) * dh])


# ---------------------------------------------------------------- the stack


@njit(cache=True)
def _layer(h, start, lw, k_cache, v_cache, cos, sin, eps, n_heads, window):
    """One decoder layer, h [L, D] in place.
    lw = LayerWeights.arrays(); k/v_cache [KVH, T, Dh]; window 0 = whole context"""
    attn_norm, wqkv, wo, mlp_norm, w_gate_up, w_down, bqkv, q_norm, k_norm = lw
    n_tok = h.shape[0]
    dh = k_cache.shape[2]
    x = np.empty_like(h)  # [L, D]
    _rmsnorm(h, attn_norm, eps, x)
    qkv = np.empty((n_tok, wqkv.shape[0]), np.float32)  # [L, (H+2KVH)*Dh]
    _matmul(x, wqkv, qkv)
    if bqkv.shape[0]:
        _add_bias(qkv, bqkv)
    if q_norm.shape[0]:
        _head_norms(qkv, n_heads, k_cache.shape[0], q_norm, k_norm, eps)
    q = np.empty((n_tok, n_heads, dh), np.float32)  # [L, H, Dh]
    _qkv_to_cache(qkv, start, n_heads, k_cache, v_cache, cos, sin, q)
    att = np.empty((n_tok, n_heads * dh), np.float32)  # [L, H*Dh]
    scores = np.empty((n_tok * n_heads, start + n_tok), np.float32)  # [L*H, T]
    _attention(q, start, k_cache, v_cache, scores, att, window)
    _matmul_add(att, wo, x, h)
    _rmsnorm(h, mlp_norm, eps, x)
    n_ff = w_down.shape[1]
    act = np.empty((n_tok, n_ff), np.float32)  # [L, F]
    _gate_up_silu(x, w_gate_up, np.empty((n_tok, 2 * n_ff), np.float32), act)
    _matmul_add(act, w_down, x, h)


@njit(cache=True)
def _forward(tokens, start, embed, layers, norm, head, k, v, cos, sin, eps, n_heads, windows):
    """tokens [L] -> logits [L, V]; k/v [n_layers, KVH, T, Dh] written at start..start+L-1;
    windows [n_layers] int64"""
    h = np.empty((tokens.shape[0], embed.shape[1]), np.float32)  # [L, D]
    for j in range(tokens.shape[0]):
        h[j] = embed[tokens[j]]
    for i in range(len(layers)):
        _layer(h, start, layers[i], k[i], v[i], cos, sin, eps, n_heads, windows[i])
    x = np.empty_like(h)
    _rmsnorm(h, norm, eps, x)
    logits = np.empty((tokens.shape[0], head.shape[0]), np.float32)  # [L, V]
    _matmul(x, head, logits)
    return logits


# ---------------------------------------------------------------- Python API


class KVCache:
    """Keys and values by absolute position. Rollback = set `length`; nothing is ever copied."""

    def __init__(self, n_layers: int, n_kv_heads: int, max_len: int, head_dim: int):
        shape = (n_layers, n_kv_heads, max_len, head_dim)  # [n_layers, KVH, T, Dh]
        self.k = np.zeros(shape, np.float32)  # zeros: pages are only touched when written
        self.v = np.zeros(shape, np.float32)
        self.length = 0  # positions 0..length-1 hold valid keys/values

    @property
    def max_len(self) -> int:
        return self.k.shape[2]


def rope_tables(config: ModelConfig, n_pos: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [n_pos, Dh] float32, computed the way transformers' LlamaRotaryEmbedding does."""
    inv_freq, attention_factor = rope_frequencies(config)
    freqs = np.arange(n_pos, dtype=np.float32)[:, None] * inv_freq[None, :]  # [T, Dh/2]
    emb = np.concatenate([freqs, freqs], axis=1)  # [T, Dh]
    cos, sin = np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)
    if attention_factor != 1.0:  # yarn scales q and k (so the scores by its square)
        cos, sin = cos * np.float32(attention_factor), sin * np.float32(attention_factor)
    return cos, sin


def rope_frequencies(config: ModelConfig) -> tuple[np.ndarray, float]:
    """inv_freq [Dh/2] float32 and the cos/sin scale, as transformers' `modeling_rope_utils`
    computes them (in float32, step for step) for rope types default, linear, llama3, yarn."""
    r, dh = config.rope_scaling, config.head_dim
    exponents = np.arange(0, dh, 2, dtype=np.float32) / np.float32(dh)  # [Dh/2]
    pos_freqs = np.float32(config.rope_theta) ** exponents  # theta^(2i/Dh)
    inv_freq = (np.float32(1.0) / pos_freqs).astype(np.float32)
    if r.rope_type == "linear":
        return (inv_freq / np.float32(r.factor)).astype(np.float32), 1.0
    if r.rope_type == "llama3":
        return _llama3_frequencies(inv_freq, r), 1.0
    if r.rope_type == "yarn":
        return _yarn_frequencies(pos_freqs, r, config.rope_theta, dh)
    return inv_freq, 1.0


def _llama3_frequencies(inv_freq: np.ndarray, r) -> np.ndarray:
    """Llama 3.1: long wavelengths divided by `factor`, short ones kept, a smooth blend between."""
    f32 = np.float32
    old = r.original_max_position_embeddings
    low_wavelen, high_wavelen = old / r.low_freq_factor, old / r.high_freq_factor
    wavelen = f32(2 * np.pi) / inv_freq  # [Dh/2]
    scaled = np.where(wavelen > low_wavelen, inv_freq / f32(r.factor), inv_freq).astype(f32)
    smooth = ((f32(old) / wavelen - f32(r.low_freq_factor))
              / f32(r.high_freq_factor - r.low_freq_factor)).astype(f32)
    smoothed = (f32(1) - smooth) * scaled / f32(r.factor) + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(f32)


def _yarn_frequencies(pos_freqs: np.ndarray, r, theta: float, dh: int) -> tuple[np.ndarray, float]:
    """YaRN: interpolate low frequencies, extrapolate high ones, ramp between; scale cos/sin."""
    f32 = np.float32

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    factor = r.factor
    attention_factor = r.attention_factor
    if attention_factor is None:
        attention_factor = (mscale(factor, r.mscale) / mscale(factor, r.mscale_all_dim)
                            if r.mscale and r.mscale_all_dim else mscale(factor))

    def correction_dim(n_rot):
        return (dh * math.log(r.original_max_position_embeddings / (n_rot * 2 * math.pi))
                / (2 * math.log(theta)))

    low, high = correction_dim(r.beta_fast), correction_dim(r.beta_slow)
    if r.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dh - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(dh // 2, dtype=f32) - f32(low)) / f32(high - low), 0, 1).astype(f32)
    extrapolation = (f32(1) - ramp).astype(f32)  # [Dh/2] 1 = keep the original frequency
    inv_extra = (f32(1) / pos_freqs).astype(f32)
    inv_inter = (f32(1) / (f32(factor) * pos_freqs)).astype(f32)
    inv_freq = inv_inter * (f32(1) - extrapolation) + inv_extra * extrapolation
    return inv_freq.astype(f32), float(attention_factor)


class Transformer:
    """A Llama decoder over float32 weights; `forward` is the one entry point."""

    def __init__(self, config: ModelConfig, weights: Weights):
        self.config = config
        self.weights = weights
        self._eps = np.float32(config.rms_norm_eps)
        self._cos, self._sin = rope_tables(config, config.max_position_embeddings)
        self._layers = List()
        for lw in weights.layers:
            self._layers.append(lw.arrays())
        n_layers = config.num_hidden_layers
        self._windows = np.array([config.layer_window(i) for i in range(n_layers)], np.int64)

    def warm_up(self) -> None:
        """Compile (first run) or load the kernel from numba's cache now, not inside a timing."""
        self.forward([0], 0, self.new_cache(1))

    def new_cache(self, max_len: int | None = None) -> KVCache:
        c = self.config
        n = c.max_position_embeddings if max_len is None else int(max_len)
        if not 1 <= n <= c.max_position_embeddings:
            raise KolibriError(f"cache length {n} outside 1..{c.max_position_embeddings} "
                               "(the model's context length)")
        return KVCache(c.num_hidden_layers, c.num_key_value_heads, n, c.head_dim)

    def forward(self, tokens, start_pos: int, cache: KVCache) -> np.ndarray:
        """tokens [L] at positions start_pos.. -> logits [L, V] float32, one row per token."""
        ids = self._check(tokens, start_pos, cache)
        w = self.weights
        logits = _forward(ids, start_pos, w.embed, self._layers, w.norm, w.head, cache.k, cache.v,
                          self._cos, self._sin, self._eps, self.config.num_attention_heads,
                          self._windows)
        cache.length = start_pos + len(ids)
        return logits

    def _check(self, tokens, start_pos: int, cache: KVCache) -> np.ndarray:
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        end = start_pos + len(ids)
        if len(ids) == 0:
            raise KolibriError("forward needs at least one token")
        if not 0 <= start_pos <= cache.length:
            raise KolibriError(f"start_pos {start_pos} outside 0..{cache.length} (cache.length)")
        if end > cache.max_len:
            raise KolibriError(f"positions up to {end} exceed the KV cache size {cache.max_len}; "
                               "allocate a larger cache (new_cache(max_len)) or use fewer tokens")
        if ids.min() < 0 or ids.max() >= self.config.vocab_size:
            raise KolibriError(f"token ids must be in 0..{self.config.vocab_size - 1}")
        return ids
