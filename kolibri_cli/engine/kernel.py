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
falls in the call. BLAS is never used (GEMM and GEMV round differently). Every sum is written out
in one order (`simd`'s 16 lanes and tree in the matmul, `attention`'s sums in the order LLVM's
vectorizer gave them on AVX-512), never left to the vectorizer, whose width follows the CPU: the
1-, 2- and 3-token register tiles of the matmul round every (row, token) dot alike, no tiling of
L changes a bit, and an AVX2 build gives the bits of an AVX-512 one. Norms and attention work one
token row at a time; elementwise ops are strict IEEE. The tests assert all of this with
`array_equal` for every L 1..16 and random splits, and for a build for Haswell.

Speed: matmuls run parallel over units of R weight rows strided across the matrix (R long
sequential streams per thread for the prefetcher); a unit's rows stay in L1/L2 while the L tokens
pass in register tiles, so an L-token forward reads the weights from memory once. Each layer is
five parallel regions plus a little serial work on the calling thread; the whole stack is one
compiled call, specialized (`matmul.spec_of`) to the model's block types and to what the call
needs: "lean" (decode and prefill tiles: what the first token takes), "verify" (+ the verify
tiles for 2..FEW rows) or "tree" (+ draft trees). Each compiles on first use (`cache=True`:
once per machine and source version; the lean one for the default model ~35 s of one core,
then ~0.02 s to load) and gives the same bits as the others.

Memory: weights + the KV cache + O(CHUNK) activations, whatever the prompt length. An input
longer than CHUNK tokens runs as consecutive kernel calls (invisible in the bits, by batch
invariance); attention keeps one row of scores per running thread; `prefill` computes the output
head for the last token only; the KV cache commits memory only for positions written (no
transparent huge pages); RoPE tables cover the positions used so far, not the whole context.

Weights: float32 rows or GGUF blocks (F16, BF16, Q4/Q5/Q6/Q8 kinds), decoded to float32 in
registers by `matmul`, whose sums give a quantized row bitwise the float32 row's result (the
opt-in int8 and int16 paths, `int8` and `int16`, are numeric paths of their own).

Non-goals: float16/bfloat16 arithmetic, batches of independent sequences, sampling,
dynamic/longrope RoPE, I/O of any kind (the caller loads weights).
"""

import mmap
import os

import numpy as np
from numba import njit
from numba.extending import overload
from numba.typed import List

from kolibri_cli.callbacks import Preparing
from kolibri_cli.engine import clock, int8, int16, jitcache
from kolibri_cli.engine.attention import (
    add_bias,
    attention,
    head_norms,
    qkv_to_cache,
    rmsnorm,
    tree_attention,
)
from kolibri_cli.engine.config import ModelConfig
from kolibri_cli.engine.jit import start_threads
from kolibri_cli.engine.matmul import (
    FEW,
    ORDER,
    TREE_AT,
    compile_run,
    embed_rows,
    gate_up_silu,
    matmul,
    matmul_add,
    n_rows,
    spec_of,
    spec_on,
)
from kolibri_cli.engine.rope import rope_tables
from kolibri_cli.engine.weights import Weights
from kolibri_cli.errors import KolibriError


def compiles_in_memory() -> bool:
    """Whether the forward kernel compiles in every process: no cache folder could be made."""
    return jitcache.in_memory(_forward)


def is_compiled() -> bool:
    """Whether numba's on-disk cache already holds the forward kernel (start-up is then fast)."""
    if compiles_in_memory():
        return False
    try:
        return os.path.isfile(_forward._cache._cache_file._index_path)
    except AttributeError:  # numba internals changed: assume compiled, say nothing
        return True



@njit(cache=True)
def _layer_list(first):
    """A typed List holding `first`. Built by cached compiled code: List().append from Python
    compiles numba's list methods in every process, and that compile alone kept ~30 MB of numba's
    compiler and LLVM's code generator resident for the whole run."""
    layers = List()
    layers.append(first)
    return layers


@njit(cache=True)
def _append_layer(layers, layer):
    layers.append(layer)


def _attend(q, start, k_cache, v_cache, att, window, tree, spec, prof):
    """Attention of the rows q: along a draft tree when the call has one (and the spec has
    trees), else the chain's"""
    raise NotImplementedError("compiled code only")


@overload(_attend, inline="always")
def _attend_for(q, start, k_cache, v_cache, att, window, tree, spec, prof):
    if not spec_on(spec, TREE_AT):
        def chain(q, start, k_cache, v_cache, att, window, tree, spec, prof):
            attention(q, start, k_cache, v_cache, att, window, prof)

        return chain

    def either(q, start, k_cache, v_cache, att, window, tree, spec, prof):
        if tree[0].shape[0]:
            tree_attention(q, start, k_cache, v_cache, att, window, tree[0], tree[1], prof)
            clock.region_done(prof, q.shape[0] * q.shape[1])
        else:
            attention(q, start, k_cache, v_cache, att, window, prof)

    return either


@njit(cache=True, inline="always")
def _layer(h, start, lw, k_cache, v_cache, cos, sin, eps, n_heads, window, tree, spec, prof):
    """One decoder layer, h [L, D] in place. Inlined into `_forward` (numba IR, the same
    expressions): numba optimizes each compiled function together with all it links in, so a
    `_layer` of its own was optimized twice, alone and again inside `_forward`: ~1.5 s more of
    the first run's last, serial compile.
    lw = LayerWeights.arrays(); k/v_cache [KVH, T, Dh]; window 0 = whole context;
    tree = (depth [L], path [L, max depth]) of a draft tree (both empty: a chain);
    spec: what the call may meet (matmul.spec_of); prof: `clock`'s slots, each piece's time
    added (zero-length: not profiled)"""
    attn_norm, wqkv, wo, mlp_norm, w_gate_up, w_down, bqkv, q_norm, k_norm = lw
    n_tok = h.shape[0]
    dh = k_cache.shape[2]
    t = clock.start(prof)
    x = np.empty_like(h)  # [L, D]
    rmsnorm(h, attn_norm, eps, x)
    t = clock.lap(prof, clock.NORMS, t)
    qkv = np.empty((n_tok, n_rows(wqkv)), np.float32)  # [L, (H+2KVH)*Dh]
    matmul(x, wqkv, qkv, spec, prof)
    t = clock.lap(prof, clock.QKV, t)
    if bqkv.shape[0]:
        add_bias(qkv, bqkv)
    if q_norm.shape[0]:
        head_norms(qkv, n_heads, k_cache.shape[0], q_norm, k_norm, eps)
    t = clock.lap(prof, clock.NORMS, t)
    q = np.empty((n_tok, n_heads, dh), np.float32)  # [L, H, Dh]
    qkv_to_cache(qkv, start, n_heads, k_cache, v_cache, cos, sin, q, tree[0])
    t = clock.lap(prof, clock.ROPE, t)
    att = np.empty((n_tok, n_heads * dh), np.float32)  # [L, H*Dh]
    _attend(q, start, k_cache, v_cache, att, window, tree, spec, prof)
    t = clock.lap(prof, clock.ATTENTION, t)
    matmul_add(att, wo, x, h, spec, prof)
    t = clock.lap(prof, clock.OUT, t)
    rmsnorm(h, mlp_norm, eps, x)
    t = clock.lap(prof, clock.NORMS, t)
    n_ff = n_rows(w_gate_up) // 2
    act = np.empty((n_tok, n_ff), np.float32)  # [L, F]
    gate_up_silu(x, w_gate_up, np.empty((n_tok, 2 * n_ff), np.float32), act, spec, prof)
    t = clock.lap(prof, clock.GATE_UP, t)
    matmul_add(act, w_down, x, h, spec, prof)
    clock.lap(prof, clock.DOWN, t)


@njit(cache=True)
def _forward(tokens, start, embed, layers, norm, head, k, v, cos, sin, eps, n_heads, windows,
             logits, tree, spec, prof):
    """tokens [L] -> logits [M, V] of the last M tokens (M <= L; 0 = none); k/v [n_layers, KVH,
    T, Dh] written at start..start+L-1; windows [n_layers] int64; tree, spec, prof: _layer's"""
    t = clock.start(prof)
    h = np.empty((tokens.shape[0], norm.shape[0]), np.float32)  # [L, D]
    embed_rows(embed, tokens, h, spec)
    clock.lap(prof, clock.EMBED, t)
    for i in range(len(layers)):
        _layer(h, start, layers[i], k[i], v[i], cos, sin, eps, n_heads, windows[i], tree, spec,
               prof)
    if logits.shape[0]:
        t = clock.start(prof)
        last = h[h.shape[0] - logits.shape[0]:]  # [M, D]
        x = np.empty_like(last)
        rmsnorm(last, norm, eps, x)
        t = clock.lap(prof, clock.NORMS, t)
        matmul(x, head, logits, spec, prof)
        clock.lap(prof, clock.HEAD, t)



# ---------------------------------------------------------------- Python API

CHUNK = 256  # most tokens per kernel call: longer inputs run in chunks of this many
KERNELS = ("lean", "verify", "tree")  # the specializations (Transformer._spec)
KERNEL_WORDS = {  # each specialization as a user knows what it serves
    "lean": "the forward kernel (plain decoding, prefill)",
    "verify": "the kernel that checks drafts (speculative decoding)",
    "tree": "the kernel that checks draft trees",
}


def _untouched_zeros(shape: tuple[int, ...]) -> np.ndarray:
    """float32 zeros whose pages are committed one 4 KiB page at a time, when first written.

    numpy advises the kernel to back big arrays with transparent huge pages, so the first write
    into each (layer, head) block of a KV cache committed (and zeroed) 2 MiB: ~360 MB and most of
    a second before the first token on the default model, whatever the prompt. A fresh anonymous
    mapping advised against huge pages commits only what is written."""
    n = int(np.prod(shape, dtype=np.int64))
    try:
        buf = mmap.mmap(-1, max(4 * n, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, OverflowError):
        raise KolibriError(f"cannot reserve {4 * n / 1e9:.1f} GB for a KV cache of shape "
                           f"{shape}; use fewer tokens (a smaller --max-tokens)") from None
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buf, np.float32, count=n).reshape(shape)


class KVCache:
    """Keys and values by absolute position. Rollback = set `length`; nothing is ever copied.
    Memory is committed as positions are written, not when the cache is made."""

    def __init__(self, n_layers: int, n_kv_heads: int, max_len: int, head_dim: int):
        shape = (n_layers, n_kv_heads, max_len, head_dim)  # [n_layers, KVH, T, Dh]
        self.k = _untouched_zeros(shape)
        self.v = _untouched_zeros(shape)
        self.length = 0  # positions 0..length-1 hold valid keys/values

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def keep_branch(self, start: int, rows: list[int]) -> None:
        """After a tree pass from `start`: the accepted branch's rows (offsets from start, depth
        order) become positions start+1..; exact copies, then `length` ends after them. Each
        row's key was already rotated for that position (its depth)."""
        for i, row in enumerate(rows, start=1):
            if row != i:  # row >= i: a node's row is never before its depth
                self.k[:, :, start + i] = self.k[:, :, start + row]
                self.v[:, :, start + i] = self.v[:, :, start + row]
        self.length = start + len(rows) + 1


class Transformer:
    """A Llama decoder over float32 weights; `forward` is the one entry point (`prefill` is
    forward keeping only the last row)."""

    def __init__(self, config: ModelConfig, weights: Weights):
        self.config = config
        self.weights = weights
        self._eps = np.float32(config.rms_norm_eps)
        self._cos, self._sin = rope_tables(config, min(CHUNK, config.max_position_embeddings))
        self._layers = _layer_list(weights.layers[0].arrays())  # typed List of layer tuples
        for lw in weights.layers[1:]:
            _append_layer(self._layers, lw.arrays())
        n_layers = config.num_hidden_layers
        self._windows = np.array([config.layer_window(i) for i in range(n_layers)], np.int64)
        self._specs = _specs(weights)
        start_threads()

    def warm_up(self, kernels=KERNELS, preparing: Preparing | None = None) -> None:
        """Compile (first run) or load from numba's cache now, not inside a timing, the kernel's
        specializations named: "lean" (decode, prefill), "verify" (2..FEW rows), "tree".
        `preparing(words, i, n)` is told before each (KERNEL_WORDS)."""
        for i, kind in enumerate(kernels):
            if preparing:
                preparing(KERNEL_WORDS[kind], i, len(kernels))
            parents = [-1, 0] if kind == "tree" else None
            self.forward([0] * (1 if kind == "lean" else 2), 0, self.new_cache(2), parents)

    def new_cache(self, max_len: int | None = None) -> KVCache:
        c = self.config
        n = c.max_position_embeddings if max_len is None else int(max_len)
        if not 1 <= n <= c.max_position_embeddings:
            raise KolibriError(f"cache length {n} outside 1..{c.max_position_embeddings} "
                               "(the model's context length)")
        return KVCache(c.num_hidden_layers, c.num_key_value_heads, n, c.head_dim)

    def forward(self, tokens, start_pos: int, cache: KVCache, parents=None,
                prof: np.ndarray = clock.NO_PROF) -> np.ndarray:
        """tokens [L] at positions start_pos.. -> logits [L, V] float32, one row per token.

        With `parents` [L] the tokens are a draft tree: row 0 the last committed token
        (parent -1), every other row a node whose parent row comes before it. Each row attends
        to the context and its own branch only, at position start_pos + its depth, and its
        logits are bitwise those of the chain along its branch; the rows go to the cache in
        call order (KVCache.keep_branch moves the accepted ones into place). `prof`
        (clock.new_prof()) adds the cycles of each piece of the forward (bench --profile)."""
        ids = self._check(tokens, start_pos, cache)
        logits = np.empty((len(ids), self.config.vocab_size), np.float32)  # [L, V]
        self._run(ids, start_pos, cache, logits, _tree_layout(parents, len(ids)), prof)
        return logits

    def prefill(self, tokens, start_pos: int, cache: KVCache) -> np.ndarray:
        """forward's last row only: logits [V] of the last token. Memory stays O(one row) for any
        prompt length (forward's [L, V] would be 1.6 GB for 8k tokens of a 49k vocabulary)."""
        ids = self._check(tokens, start_pos, cache)
        last = np.empty((1, self.config.vocab_size), np.float32)  # [1, V]
        self._run(ids, start_pos, cache, last)
        return last[0]

    def _run(self, ids: np.ndarray, start_pos: int, cache: KVCache, logits: np.ndarray,
             tree=None, prof: np.ndarray = clock.NO_PROF) -> None:
        """The kernel over chunks of at most CHUNK tokens; logits [M, V] receives the rows of the
        last M tokens. Batch invariance makes the chunking invisible in the bits; it bounds the
        per-layer activations to O(CHUNK * (D + F)) whatever L is. A draft tree (its rows point
        at each other) runs in one call."""
        n, m = len(ids), logits.shape[0]
        self._grow_rope(start_pos + n)
        w = self.weights
        tree, chunk = (_CHAIN, CHUNK) if tree is None else (tree, n)
        for a in range(0, n, chunk):
            b = min(a + chunk, n)
            first = max(a, n - m)  # the chunk's first token with a logits row
            rows = logits[first - (n - m) : max(first, b) - (n - m)]  # [<= CHUNK, V]
            _forward(ids[a:b], start_pos + a, w.embed.arrays(), self._layers, w.norm,
                     w.head.arrays(), cache.k, cache.v, self._cos, self._sin, self._eps,
                     self.config.num_attention_heads, self._windows, rows, tree,
                     self._spec(b - a, m, tree), prof)
        cache.length = start_pos + n

    def _spec(self, n: int, m: int, tree) -> tuple:
        """The kernel specialization for n tokens, m logits rows: the lean one (decode and
        prefill tiles) unless a pass of 2..FEW rows wants them all back (verify: the verify
        tiles) or brings a draft tree. Every one gives the same bits; each compiles on first
        use."""
        if tree[0].shape[0]:
            return self._specs["tree"]
        return self._specs["verify" if 1 < n <= FEW and m == n else "lean"]

    def _grow_rope(self, n_pos: int) -> None:
        """cos/sin tables for positions 0..n_pos-1 at least, doubled as positions grow (a
        position's values do not depend on the table's length), never past the context."""
        if n_pos > self._cos.shape[0]:
            n = min(max(n_pos, 2 * self._cos.shape[0]), self.config.max_position_embeddings)
            self._cos, self._sin = rope_tables(self.config, n)

    def _check(self, tokens, start_pos: int, cache: KVCache) -> np.ndarray:
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        end = start_pos + len(ids)
        self._check_cache(cache)
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

    def _check_cache(self, cache: KVCache) -> None:
        """The kernel indexes the cache without bounds checks: a cache of another model's shape
        (or longer than the context, past the RoPE tables) would be read out of bounds."""
        c = self.config
        shape = (c.num_hidden_layers, c.num_key_value_heads, cache.max_len, c.head_dim)
        fits = cache.k.shape == cache.v.shape == shape and cache.k.dtype == cache.v.dtype
        if not (fits and cache.k.dtype == np.float32 and shape[2] <= c.max_position_embeddings):
            raise KolibriError(f"a KV cache of shape {cache.k.shape} does not fit this model "
                               f"({shape[:2]} x up to {c.max_position_embeddings} x {shape[3]}); "
                               "make it with this model's new_cache")


_CHAIN = (np.zeros(0, np.int64), np.zeros((0, 0), np.int64))  # _layer's tree for a chain


def _specs(weights: Weights) -> dict[str, tuple]:
    """The kernel's specializations for these weights: their block types (and the int8 or int16
    path when some matrix is on it), with or without the verify tiles and draft trees."""
    matrices = [weights.embed, weights.head, *(m for lw in weights.layers for m in lw.matrices())]
    codes = {int(t) for m in matrices for t in m.units[:, 2]}
    exact = codes & set(ORDER)
    paths = {"int8_path": bool(codes & {int8.Q4_1X, int8.Q8_0X}),
             "int16_path": bool(codes & {int16.Q4_1W, int16.Q8_0W})}
    return {"lean": spec_of(exact, few=False, **paths),
            "verify": spec_of(exact, few=True, **paths),
            "tree": spec_of(exact, few=True, tree=True, **paths)}


HALVES = ("matmul", "rest")  # kernel.compile_half: what the lean kernel calls, in two halves


def compile_half(config: ModelConfig, weights: Weights, half: str) -> None:
    """Compile (or load from numba's cache) half of what the lean kernel calls, with the argument
    types `_layer` and `_forward` pass: "matmul" (matmul's `_run`, about half of the compile) or
    "rest" (the layer list, embedding, norms, RoPE and attention). numba caches each function
    apart, so two processes compiling a half each fill the cache in about half the time of one;
    the kernel's own compile (warm_up) then compiles `_forward` (`_layer` inlined) only, linking
    the halves. Each function runs once on zeros (weights of a model of the right block types; the
    values are never used for anything)."""
    c, spec = config, _specs(weights)["lean"]
    lw = weights.layers[0].arrays()
    h = np.zeros((1, c.hidden_size), np.float32)  # [L, D], as in _forward
    qkv = np.zeros((1, (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim),
                   np.float32)  # [L, (H+2KVH)*Dh], as in _layer
    if half == "matmul":
        compile_run(h, lw[1], qkv, spec, clock.NO_PROF)
        return
    if half != "rest":
        raise ValueError(f"half must be one of {HALVES}, not {half!r}")
    t = Transformer(config, weights)  # compiles the layer list's functions
    embed_rows(weights.embed.arrays(), np.zeros(1, np.int64), h, spec)
    rmsnorm(h, lw[0], t._eps, np.empty_like(h))
    add_bias(qkv, np.zeros(qkv.shape[1], lw[6].dtype))
    ones = np.ones(c.head_dim, lw[7].dtype)  # q, k head norms of Dh
    head_norms(qkv, c.num_attention_heads, c.num_key_value_heads, ones, ones, t._eps)
    cache = t.new_cache(2)
    q = np.empty((1, c.num_attention_heads, c.head_dim), np.float32)  # [L, H, Dh]
    qkv_to_cache(qkv, 0, c.num_attention_heads, cache.k[0], cache.v[0], t._cos, t._sin, q,
                 _CHAIN[0])
    att = np.empty((1, c.num_attention_heads * c.head_dim), np.float32)  # [L, H*Dh]
    attention(q, 0, cache.k[0], cache.v[0], att, t._windows[0], clock.NO_PROF)


def _tree_layout(parents, n: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(depths [L], branch rows [L, max depth]) of a tree given by `parents`; None: a chain."""
    if parents is None:
        return None
    parents = [int(p) for p in parents]
    if len(parents) != n or parents[0] != -1 or any(
            not 0 <= p < j for j, p in enumerate(parents) if j):
        raise KolibriError("a tree's parents: one per token, -1 for row 0, then an earlier row")
    depth = [0] * n
    for j in range(1, n):
        depth[j] = depth[parents[j]] + 1
    path = np.zeros((n, max(max(depth), 1)), np.int64)  # [L, max depth]
    for j in range(1, n):
        path[j, : depth[j] - 1] = path[parents[j], : depth[parents[j]]]
        path[j, depth[j] - 1] = j
    return np.asarray(depth, np.int64), path
