"""Per-token pieces of a decoder layer: RMSNorm, biases, per-head q/k norms, rotate-half RoPE,
and causal grouped-query attention over the KV cache. Each works one token row at a time, so
none of them depends on how many tokens share the call."""

import numpy as np
from numba import njit, prange

from kolibri_cli.engine import clock
from kolibri_cli.engine.jit import ONE, REDUCE, ZERO
from kolibri_cli.engine.simd import fma32, vbcast, vfma, vload_row, vsum, vsum_start

NZERO = np.float32(-0.0)

# ---------------------------------------------------------------- sums in one written order
# Each sum of n terms x*y runs in the order LLVM's loop vectorizer gave `s += a[i] * b[i]`
# (fastmath reassoc) on the AVX-512 hosts kolibri's bits come from: 16 lanes over the first
# n // 16 * 16 terms (lane 0 starting at +0, the others at -0), closed by the `vsum` tree; then,
# if 4 or more terms are left, 4 lanes over their multiples of 4 (lane 0 starting at that sum,
# the others at -0), closed by (l0 + l2) + (l1 + l3); then one term at a time; each product
# fused into its partial sum. Written out, the order no longer depends on the CPU the code is
# compiled for (for AVX2 the vectorizer takes 8 lanes, and other bits).


@njit(inline="always", cache=True)
def _products(a, b, i):
    return vload_row(a, i), vload_row(b, i)


@njit(inline="always", cache=True)
def _product(a, b, j):
    return a[j], b[j]


@njit(inline="always", cache=True)
def _values(a, b, i):
    """a[i:i+16] times 1 (exact: the fused add is the plain sum)"""
    return vload_row(a, i), vbcast(ONE)


@njit(inline="always", cache=True)
def _value(a, b, j):
    return a[j], ONE


@njit(inline="always", cache=True)
def _fused(term, a, b, j, s):
    x, y = term(a, b, j)
    return fma32(x, y, s)


@njit(inline="always", cache=True)
def _in_order(vterms, term, a, b, n):
    """The sum over j < n of x*y, (x, y) = term(a, b, j), 16 of them vterms(a, b, i), in the
    order above"""
    s, i = ZERO, 0
    if n >= 16:
        acc = vsum_start()
        for c in range(0, n - 15, 16):
            x, y = vterms(a, b, c)
            acc = vfma(x, y, acc)
        s, i = vsum(acc), n // 16 * 16
    if n - i >= 4:
        s0, s1, s2, s3 = s, NZERO, NZERO, NZERO
        for c in range(i, n - 3, 4):
            s0, s1 = _fused(term, a, b, c, s0), _fused(term, a, b, c + 1, s1)
            s2, s3 = _fused(term, a, b, c + 2, s2), _fused(term, a, b, c + 3, s3)
        s, i = (s0 + s2) + (s1 + s3), n // 4 * 4
    for j in range(i, n):
        s = _fused(term, a, b, j, s)
    return s


@njit(cache=True)
def _sum_squares(x):
    """x [D] -> sum of x^2 (float32)"""
    return _in_order(_products, _product, x, x, x.shape[0])


@njit(cache=True)
def rmsnorm(x, w, eps, out):
    """out = x * rsqrt(mean(x^2) + eps) * w   x [L, D], w [D], out [L, D]"""
    d = np.float32(x.shape[1])
    for j in range(x.shape[0]):
        inv = ONE / np.sqrt(_sum_squares(x[j]) / d + eps)
        for i in range(x.shape[1]):
            out[j, i] = w[i] * (x[j, i] * inv)


@njit(cache=True)
def add_bias(x, b):
    """x += b on every row   x [L, N], b [N]"""
    for j in range(x.shape[0]):
        for i in range(x.shape[1]):
            x[j, i] += b[i]


@njit(cache=True)
def head_norms(qkv, n_heads, n_kv, q_norm, k_norm, eps):
    """RMSNorm over Dh of every q and k head in place (Qwen3), before RoPE.
    qkv [L, (H+2KVH)*Dh], q_norm/k_norm [Dh]"""
    dh = q_norm.shape[0]
    for j in range(qkv.shape[0]):
        for h in range(n_heads + n_kv):
            x = qkv[j:j + 1, h * dh:(h + 1) * dh]  # [1, Dh]
            rmsnorm(x, q_norm if h < n_heads else k_norm, eps, x)


@njit(cache=True)
def _rope(x, cos, sin):
    """Rotate-half RoPE in place   x [Dh], cos/sin [Dh] (one position)"""
    half = x.shape[0] // 2
    for i in range(half):
        a, b = x[i], x[i + half]
        x[i] = a * cos[i] - b * sin[i]
        x[i + half] = b * cos[i + half] + a * sin[i + half]


@njit(cache=True)
def qkv_to_cache(qkv, start, n_heads, k_cache, v_cache, cos, sin, q, depth):
    """Split qkv, rope q and k, write k/v at cache rows start.. . A chain (depth empty) ropes row
    j at position start+j; a tree's node j at start+depth[j] (its row stays start+j).
    qkv [L, (H+2KVH)*Dh], k_cache/v_cache [KVH, T, Dh], cos/sin [T, Dh], depth [L] or [0]
    -> q [L, H, Dh]"""
    n_kv, _, dh = k_cache.shape
    for j in range(qkv.shape[0]):
        p, r = start + (depth[j] if depth.shape[0] else j), start + j
        for h in range(n_heads):
            q[j, h] = qkv[j, h * dh:(h + 1) * dh]
            _rope(q[j, h], cos[p], sin[p])
        for g in range(n_kv):
            k_cache[g, r] = qkv[j, (n_heads + g) * dh:(n_heads + g + 1) * dh]
            _rope(k_cache[g, r], cos[p], sin[p])
            v_cache[g, r] = qkv[j, (n_heads + n_kv + g) * dh:(n_heads + n_kv + g + 1) * dh]


@njit(cache=True)
def _dot(a, b):
    """a [Dh], b [Dh] -> float32"""
    return _in_order(_products, _product, a, b, a.shape[0])


@njit(fastmath=REDUCE, cache=True)
def _max(s):
    """s [T] -> max (exact: any order gives it)"""
    m = s[0]
    for t in range(1, s.shape[0]):
        m = max(m, s[t])
    return m


@njit(cache=True)
def _softmax_inplace(s):
    """s [T] scores -> probabilities (max-subtracted, float32, like torch.softmax)"""
    m = _max(s)
    for t in range(s.shape[0]):
        s[t] = np.exp(s[t] - m)
    total = _in_order(_values, _value, s, s, s.shape[0])
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
def _attention(q, start, k_cache, v_cache, out, window, prof):
    n_q, n_heads, dh = q.shape
    group = n_heads // k_cache.shape[0]
    scale = np.float32(1.0 / np.sqrt(dh))
    for i in prange(n_q * n_heads):
        clock.chunk_start(prof, np.int64(i))
        j, h = i // n_heads, i % n_heads
        n = start + j + 1
        lo = max(0, n - window) if window > 0 else 0  # transformers: kv > q - window
        g = h // group
        _attend_one(q[j, h], k_cache[g, lo:n], v_cache[g, lo:n], scale,
                    np.empty(n - lo, np.float32), out[j, h * dh:(h + 1) * dh])
        clock.chunk_end(prof, np.int64(i))


@njit(cache=True)
def attention(q, start, k_cache, v_cache, out, window=0, prof=None):
    """Causal GQA: row l attends to positions 0..start+l, or to the last `window` of them.
    q [L, H, Dh], k/v_cache [KVH, T, Dh] -> out [L, H*Dh]. Each (row, head) gets its own
    scores [<= start+L] while it runs: memory O(threads * T), not O(L * H * T).
    prof: `clock`'s (each (row, head) stamps its start and end), None: not profiled."""
    if prof is None:
        _attention(q, start, k_cache, v_cache, out, window, np.zeros(0, np.int64))
    else:
        _attention(q, start, k_cache, v_cache, out, window, prof)
        clock.region_done(prof, q.shape[0] * q.shape[1])


@njit(cache=True)
def _attend_rows(q, k, v, rows, scale, scores, out):
    """_attend_one over the cache rows `rows`, in that order: the same arithmetic in the same
    order as over those rows laid out contiguously.
    q [Dh], k/v [T, Dh], rows [n], scores [n] -> out [Dh]"""
    for t in range(rows.shape[0]):
        scores[t] = _dot(q, k[rows[t]]) * scale
    _softmax_inplace(scores)
    out[:] = ZERO
    for t in range(rows.shape[0]):
        for i in range(out.shape[0]):
            out[i] += scores[t] * v[rows[t], i]


@njit(parallel=True, cache=True)
def tree_attention(q, start, k_cache, v_cache, out, window, depth, path, prof):
    """Attention for a draft tree: row l (a node at depth[l]) attends to positions 0..start and
    then to the rows of its own branch, path[l, :depth[l]] (offsets from start, depth 1 first,
    itself last) — exactly the keys, in the order, a chain along that branch would see, so its
    output is bitwise the chain's. Row 0, the root, has depth 0.
    q [L, H, Dh], k/v_cache [KVH, T, Dh], depth [L], path [L, max depth] -> out [L, H*Dh]"""
    n_q, n_heads, dh = q.shape
    group = n_heads // k_cache.shape[0]
    scale = np.float32(1.0 / np.sqrt(dh))
    for i in prange(n_q * n_heads):
        clock.chunk_start(prof, np.int64(i))
        j, h = i // n_heads, i % n_heads
        n = start + 1 + depth[j]  # keys = positions 0..n-1
        lo = max(0, n - window) if window > 0 else 0
        rows = np.empty(n - lo, np.int64)
        for t in range(lo, n):
            rows[t - lo] = t if t <= start else start + path[j, t - start - 1]
        g = h // group
        _attend_rows(q[j, h], k_cache[g], v_cache[g], rows, scale, np.empty(n - lo, np.float32),
                     out[j, h * dh:(h + 1) * dh])
        clock.chunk_end(prof, np.int64(i))
