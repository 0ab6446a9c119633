"""The forward kernel: a Llama-family decoder in float32 numba, batch-invariant by construction.

Scope: one `Transformer.forward(tokens, start_pos, cache) -> logits [L, V]` serves prefill, 1-token
decode and multi-token speculative verify. It computes exactly what Hugging Face transformers'
LlamaForCausalLM computes (RMSNorm, rotate-half RoPE, grouped-query causal attention, SwiGLU MLP,
final norm, output head), in float32, with a KV cache indexed by position (rollback = set
`cache.length`, never copy).

Batch invariance: a position's logits are bitwise identical whatever L is and wherever the row
falls in the call. BLAS is never used (GEMM and GEMV round differently). Every output element is
computed by one fixed loop whose code path depends only on the matrix shape and the row index, never
on L: matmuls run parallel over blocks of R weight rows, and each block loops over the L input rows
with the block kept in L1, so an L-token forward still reads the weights from memory once.
Reductions use fastmath `reassoc` so LLVM vectorizes them; the vectorized loop is the same machine
code for every input row, so the summation order is too (tests assert this bitwise).

Non-goals: quantized weights, float16/bfloat16, batches of independent sequences, sampling, rope
scaling variants, sliding windows, I/O of any kind (the caller loads weights).
"""

import numba
import numpy as np
from numba import njit, prange
from numba.typed import List

from kolibri_cli.config import ModelConfig
from kolibri_cli.errors import KolibriError
from kolibri_cli.weights import Weights

REDUCE = {"reassoc", "contract"}  # fastmath for reductions only: no nnan/ninf/afn
R = 8  # weight rows per parallel block: they stay in L1/L2 while all L input rows use them
ONE = np.float32(1.0)
ZERO = np.float32(0.0)


def set_threads(n: int) -> None:
    """Use n threads for the parallel kernels (the `--threads` option)."""
    if n < 1 or n > numba.config.NUMBA_NUM_THREADS:
        raise KolibriError(f"--threads must be 1..{numba.config.NUMBA_NUM_THREADS}, got {n}")
    numba.set_num_threads(n)


# ---------------------------------------------------------------- matmul: x @ w.T, row blocks


@njit(fastmath=REDUCE, cache=True)
def _block(x, w, r0, out):
    """out[:, r0:r0+R] = x @ w[r0:r0+R].T   x [L, K], w [N, K], out [L, N]"""
    for j in range(x.shape[0]):
        s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = ZERO
        for k in range(x.shape[1]):
            xk = x[j, k]
            s0 += w[r0, k] * xk
            s1 += w[r0 + 1, k] * xk
            s2 += w[r0 + 2, k] * xk
            s3 += w[r0 + 3, k] * xk
            s4 += w[r0 + 4, k] * xk
            s5 += w[r0 + 5, k] * xk
            s6 += w[r0 + 6, k] * xk
            s7 += w[r0 + 7, k] * xk
        out[j, r0], out[j, r0 + 1], out[j, r0 + 2], out[j, r0 + 3] = s0, s1, s2, s3
        out[j, r0 + 4], out[j, r0 + 5], out[j, r0 + 6], out[j, r0 + 7] = s4, s5, s6, s7


@njit(fastmath=REDUCE, cache=True)
def _row(x, w, r, out):
    """out[:, r] = x @ w[r]   (rows left over when N % R != 0; always the same rows for a shape)"""
    for j in range(x.shape[0]):
        s = ZERO
        for k in range(x.shape[1]):
            s += w[r, k] * x[j, k]
        out[j, r] = s


@njit(cache=True)
def _rows(x, w, r0, n, out):
    """out[:, r0:r0+n] = x @ w[r0:r0+n].T, n <= R; the path depends on (r0, n) only, never on L."""
    if n == R:
        _block(x, w, r0, out)
    else:
        for r in range(r0, r0 + n):
            _row(x, w, r, out)


@njit(parallel=True, cache=True)
def _matmul(x, w, out):
    """out = x @ w.T   x [L, K], w [N, K] -> out [L, N]"""
    n_rows = w.shape[0]
    for b in prange((n_rows + R - 1) // R):
        r0 = b * R
        _rows(x, w, r0, min(R, n_rows - r0), out)


@njit(parallel=True, cache=True)
def _matmul_add(x, w, tmp, h):
    """h += x @ w.T (the residual add fused in)   x [L, K], w [D, K], tmp/h [L, D]"""
    n_rows = w.shape[0]
    for b in prange((n_rows + R - 1) // R):
        r0 = b * R
        n = min(R, n_rows - r0)
        _rows(x, w, r0, n, tmp)
        for j in range(x.shape[0]):
            for r in range(r0, r0 + n):
                h[j, r] += tmp[j, r]


@njit(cache=True)
def _silu(g):
    return g / (ONE + np.exp(-g))


@njit(parallel=True, cache=True)
def _gate_up_silu(x, w, gu, act):
    """act = silu(x @ gate.T) * (x @ up.T)
    x [L, D], w [2F, D] rows gate then up, gu [L, 2F] scratch -> act [L, F]"""
    n_ff = act.shape[1]
    for b in prange((n_ff + R - 1) // R):
        r0 = b * R
        n = min(R, n_ff - r0)
        _rows(x, w, r0, n, gu)
        _rows(x, w, n_ff + r0, n, gu)
        for j in range(x.shape[0]):
            for r in range(r0, r0 + n):
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
    """One query row against positions 0..T-1   q [Dh], k/v [T, Dh], scores [T] -> out [Dh]"""
    for t in range(k.shape[0]):
        scores[t] = _dot(q, k[t]) * scale
    _softmax_inplace(scores)
    out[:] = ZERO
    for t in range(k.shape[0]):
        for i in range(out.shape[0]):
            out[i] += scores[t] * v[t, i]


@njit(parallel=True, cache=True)
def _attention(q, start, k_cache, v_cache, scores, out):
    """Causal GQA: row l attends to positions 0..start+l.
    q [L, H, Dh], k/v_cache [KVH, T, Dh], scores [L*H, start+L] -> out [L, H*Dh]"""
    n_q, n_heads, dh = q.shape
    group = n_heads // k_cache.shape[0]
    scale = np.float32(1.0 / np.sqrt(dh))
    for i in prange(n_q * n_heads):
        j, h = i // n_heads, i % n_heads
        n = start + j + 1
        g = h // group
        _attend_one(q[j, h], k_cache[g, :n], v_cache[g, :n], scale, scores[i, :n],
                    out[j, h * dh:(h + 1) * dh])


# ---------------------------------------------------------------- the stack


@njit(cache=True)
def _layer(h, start, lw, k_cache, v_cache, cos, sin, eps, n_heads):
    """One decoder layer, h [L, D] in place.
    lw = (attn_norm, wqkv, wo, mlp_norm, w_gate_up, w_down); k/v_cache [KVH, T, Dh]"""
    attn_norm, wqkv, wo, mlp_norm, w_gate_up, w_down = lw
    n_tok = h.shape[0]
    dh = k_cache.shape[2]
    x = np.empty_like(h)  # [L, D]
    _rmsnorm(h, attn_norm, eps, x)
    qkv = np.empty((n_tok, wqkv.shape[0]), np.float32)  # [L, (H+2KVH)*Dh]
    _matmul(x, wqkv, qkv)
    q = np.empty((n_tok, n_heads, dh), np.float32)  # [L, H, Dh]
    _qkv_to_cache(qkv, start, n_heads, k_cache, v_cache, cos, sin, q)
    att = np.empty((n_tok, n_heads * dh), np.float32)  # [L, H*Dh]
    scores = np.empty((n_tok * n_heads, start + n_tok), np.float32)  # [L*H, T]
    _attention(q, start, k_cache, v_cache, scores, att)
    _matmul_add(att, wo, x, h)
    _rmsnorm(h, mlp_norm, eps, x)
    n_ff = w_down.shape[1]
    act = np.empty((n_tok, n_ff), np.float32)  # [L, F]
    _gate_up_silu(x, w_gate_up, np.empty((n_tok, 2 * n_ff), np.float32), act)
    _matmul_add(act, w_down, x, h)


@njit(cache=True)
def _forward(tokens, start, embed, layers, norm, head, k, v, cos, sin, eps, n_heads):
    """tokens [L] -> logits [L, V]; k/v [n_layers, KVH, T, Dh] written at start..start+L-1"""
    h = np.empty((tokens.shape[0], embed.shape[1]), np.float32)  # [L, D]
    for j in range(tokens.shape[0]):
        h[j] = embed[tokens[j]]
    for i in range(len(layers)):
        _layer(h, start, layers[i], k[i], v[i], cos, sin, eps, n_heads)
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
    dh = config.head_dim
    exponents = np.arange(0, dh, 2, dtype=np.float32) / np.float32(dh)  # [Dh/2]
    inv_freq = (1.0 / (config.rope_theta ** exponents)).astype(np.float32)
    freqs = np.arange(n_pos, dtype=np.float32)[:, None] * inv_freq[None, :]  # [T, Dh/2]
    emb = np.concatenate([freqs, freqs], axis=1)  # [T, Dh]
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)


class Transformer:
    """A Llama decoder over float32 weights; `forward` is the one entry point."""

    def __init__(self, config: ModelConfig, weights: Weights):
        self.config = config
        self.weights = weights
        self._eps = np.float32(config.rms_norm_eps)
        self._cos, self._sin = rope_tables(config, config.max_position_embeddings)
        self._layers = List()
        for lw in weights.layers:
            arrays = (lw.attn_norm, lw.wqkv, lw.wo, lw.mlp_norm, lw.w_gate_up, lw.w_down)
            self._layers.append(arrays)

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
                          self._cos, self._sin, self._eps, self.config.num_attention_heads)
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
