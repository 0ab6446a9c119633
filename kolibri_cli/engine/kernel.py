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

import os

import numpy as np
from numba import njit
from numba.typed import List

from kolibri_cli.engine.attention import add_bias, attention, head_norms, qkv_to_cache, rmsnorm
from kolibri_cli.engine.config import ModelConfig
from kolibri_cli.engine.jit import start_threads
from kolibri_cli.engine.matmul import gate_up_silu, matmul, matmul_add
from kolibri_cli.engine.rope import rope_tables
from kolibri_cli.engine.weights import Weights
from kolibri_cli.errors import KolibriError


def is_compiled() -> bool:
    """Whether numba's on-disk cache already holds the forward kernel (start-up is then fast)."""
    try:
        return os.path.isfile(_forward._cache._cache_file._index_path)
    except AttributeError:  # numba internals changed: assume compiled, say nothing
        return True



@njit(cache=True)
def _layer(h, start, lw, k_cache, v_cache, cos, sin, eps, n_heads, window):
    """One decoder layer, h [L, D] in place.
    lw = LayerWeights.arrays(); k/v_cache [KVH, T, Dh]; window 0 = whole context"""
    attn_norm, wqkv, wo, mlp_norm, w_gate_up, w_down, bqkv, q_norm, k_norm = lw
    n_tok = h.shape[0]
    dh = k_cache.shape[2]
    x = np.empty_like(h)  # [L, D]
    rmsnorm(h, attn_norm, eps, x)
    qkv = np.empty((n_tok, wqkv.shape[0]), np.float32)  # [L, (H+2KVH)*Dh]
    matmul(x, wqkv, qkv)
    if bqkv.shape[0]:
        add_bias(qkv, bqkv)
    if q_norm.shape[0]:
        head_norms(qkv, n_heads, k_cache.shape[0], q_norm, k_norm, eps)
    q = np.empty((n_tok, n_heads, dh), np.float32)  # [L, H, Dh]
    qkv_to_cache(qkv, start, n_heads, k_cache, v_cache, cos, sin, q)
    att = np.empty((n_tok, n_heads * dh), np.float32)  # [L, H*Dh]
    scores = np.empty((n_tok * n_heads, start + n_tok), np.float32)  # [L*H, T]
    attention(q, start, k_cache, v_cache, scores, att, window)
    matmul_add(att, wo, x, h)
    rmsnorm(h, mlp_norm, eps, x)
    n_ff = w_down.shape[1]
    act = np.empty((n_tok, n_ff), np.float32)  # [L, F]
    gate_up_silu(x, w_gate_up, np.empty((n_tok, 2 * n_ff), np.float32), act)
    matmul_add(act, w_down, x, h)


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
    rmsnorm(h, norm, eps, x)
    logits = np.empty((tokens.shape[0], head.shape[0]), np.float32)  # [L, V]
    matmul(x, head, logits)
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
        start_threads()

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
