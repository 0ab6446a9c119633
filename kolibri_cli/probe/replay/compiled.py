"""Compiled replays: the Definitions' loop over whole batches of chains inside numba, no Python per
verify pass, for the proposers that have one (vllm, hf, llamacpp-simple, suffix).

Each replay gives exactly the counts of the reference loop (simulate.simulate_chain over the
proposer's `propose`/`observe`), which tests check on thousands of chains, in time linear in a
chain's length. The proposers' own kernels search the whole context at every call (O(T) a pass:
a 1M-token chain took minutes); here a chain's context only grows, so each replay keeps an index
of it: a suffix automaton for vllm and hf (the leftmost occurrence of the longest matching
suffix), a hash table of n-grams for llamacpp-simple (the most recent occurrence, verified; a
collision falls back to the proposer's own scan), and the trie of
decode/proposers/suffix_tree.py on arrays for suffix.
Non-goals: proposers without a replay here (the generic path runs them), reading goldens.
"""

import hashlib
import inspect
from pathlib import Path

import numpy as np
from numba import njit

from kolibri_cli.decode.proposers.llamacpp.simple import _most_recent_start
from kolibri_cli.decode.proposers.ngram import _first_match_start, longest_match
from kolibri_cli.engine import jitcache  # noqa: F401  (before the @njit(cache=True))
from kolibri_cli.home import make_private

VLLM, HF, LLAMACPP = 0, 1, 2  # the n-gram replay's rule
SCALARS = ("plain_steps", "verify_passes", "drafts_proposed", "drafts_accepted",
           "passes_with_drafts")  # the columns of `scalars` below
# trie node fields: occurrences, first/last child, next sibling, token, most frequent child
COUNT, FIRST, LAST, NEXT, TOKEN, BEST = range(6)


@njit(cache=True)
def _record(c, p, drafted, accepted, out):
    """One verify pass of chain c, pass number p of the batch, into the columns `out`."""
    scalars, drafted_at, accepted_at, lengths, accepts, _ = out
    scalars[c, 1] += 1
    scalars[c, 2] += drafted
    scalars[c, 3] += accepted
    if drafted > 0:
        scalars[c, 4] += 1
    for i in range(drafted):
        drafted_at[c, i] += 1
    for i in range(accepted):
        accepted_at[c, i] += 1
    lengths[p] = drafted
    accepts[p] = accepted


@njit(cache=True)
def ngram_replay(tokens, starts, prompt_lens, eos, eos_starts, rule, k, wmin, wmax, out):
    """Replay every chain c = tokens[starts[c]:starts[c+1]] (prompt_lens[c] prompt ids, then the
    output) with an n-gram rule; its counts go to row c of out's columns, its passes from
    pass_starts[c] (out = scalars, drafted_at, accepted_at, lengths, accepts, pass_starts)."""
    pass_starts, p = out[5], 0
    for c in range(prompt_lens.shape[0]):
        ctx = tokens[starts[c] : starts[c + 1]]
        pass_starts[c] = p
        if rule == LLAMACPP:
            p = _replay_recent(ctx, prompt_lens[c], k, wmax, c, p, out)
        else:
            p = _replay_leftmost(ctx, prompt_lens[c], eos[eos_starts[c] : eos_starts[c + 1]],
                                 rule, k, wmin, wmax, c, p, out)
    pass_starts[prompt_lens.shape[0]] = p


@njit(cache=True)
def _accepted(ctx, start, length, t):
    """How many of the drafted ctx[start:start+length] equal the chain's next tokens ctx[t:]."""
    a = 0
    while a < length and ctx[start + a] == ctx[t + a]:
        a += 1
    return a


@njit(cache=True)
def _replay_leftmost(ctx, n_prompt, eos, rule, k, wmin, wmax, c, p, out):
    """vllm and hf over one chain, the automaton grown with the context; returns the next pass
    number."""
    n = ctx.shape[0] - n_prompt
    out[0][c, 0] = max(n - 1, 0)
    if n < 2:
        return p
    states, edges, keys, vals, meta = _automaton(ctx.shape[0])
    seen, pos = 0, 1
    while pos < n:
        t = n_prompt + pos
        while seen < t:
            _grow(states, edges, keys, vals, meta, ctx[seen], seen, wmax)
            seen += 1
        start, length = _leftmost_draft(states, meta, t, min(k, n - pos - 1), rule, k, wmin,
                                        wmax, ctx, eos)
        a = _accepted(ctx, start, length, t)
        _record(c, p, length, a, out)
        p, pos = p + 1, pos + a + 1
    return p


@njit(cache=True)
def _leftmost_draft(states, meta, t, budget, rule, k, wmin, wmax, ctx, eos):
    """The draft for context ctx[:t] as (start in ctx, length): what the proposer's `propose`
    returns, cut to `budget` (NgramProposer, HfProposer)."""
    start = _leftmost(states, meta, wmin, wmax)
    if start < 0 or budget <= 0:
        return -1, 0
    if rule == VLLM:
        return start, min(budget, t - start)
    length = min(k, t - start)
    for i in range(length):  # hf: cut before the first eos
        for e in eos:
            if ctx[start + i] == e:
                return start, min(i, budget)
    return start, min(length, budget)


# ---- vllm, hf: a suffix automaton of the context ----------------------------------------------
# The rule (ngram.longest_match, = _first_match_start): the longest n in wmin..wmax whose
# last-n-token suffix occurred earlier, ending before the last token, and the index after its
# leftmost occurrence. In the automaton of the context, link(last) is the state of the longest
# suffix that ends earlier too, and every string of a state has the same ends, the first of which
# the state keeps: for n <= wmax that is the answer; a longer suffix is cut to the last wmax
# tokens, whose state is tracked as the context grows (no walk along the links, which a looping
# chain makes as long as the chain).
# Arrays: states int32[2T+2, 4] (length, link, first end, first edge), edges int32[3T+3, 3]
# (token, target, next edge of the same state), a table keys int64 / vals int32 (state << 31 |
# token -> edge; ids are below 2^31) at most 3/4 full, meta int64[5] (states used, edges used,
# last state, the tracked state of the last min(wmax, T) tokens, that length). int32 holds
# every index of a chain below MAX_CHAIN ids; rows are written as the automaton grows, so a
# chain's memory (~100 B an id: 1.4T states, 2.2T edges on shipped and random chains) is what
# it uses, not what it could.

_EMPTY = -1
MAX_CHAIN = 1 << 28  # ids in one chain: the automaton's int32 indexes (edges < 3T + 3)
_MIX = -7046029254386353131  # 0x9E3779B97F4A7C15 (Fibonacci hashing) as int64


@njit(cache=True)
def _table(entries):
    """An empty open-addressing table for `entries` keys (>= 0), at most 3/4 full: (keys,
    values)."""
    cap = 16
    while 3 * cap < 4 * entries:
        cap *= 2
    return np.full(cap, _EMPTY, np.int64), np.empty(cap, np.int32)


@njit(cache=True)
def _slot(keys, key):
    """The slot of `key`, or the empty slot where it would go (linear probing)."""
    mask = keys.shape[0] - 1
    h = key * _MIX
    i = (h ^ (h >> 31)) & mask
    while keys[i] != _EMPTY and keys[i] != key:
        i = (i + 1) & mask
    return i


@njit(cache=True)
def _automaton(length):
    states = np.empty((2 * length + 2, 4), np.int32)
    edges = np.empty((3 * length + 3, 3), np.int32)
    keys, vals = _table(3 * length + 3)
    meta = np.zeros(5, np.int64)
    states[0, 0], states[0, 1], states[0, 2], states[0, 3] = 0, -1, -1, -1
    meta[0] = 1
    return states, edges, keys, vals, meta


@njit(cache=True)
def _target(keys, vals, edges, state, token):
    i = _slot(keys, (np.int64(state) << 31) | token)
    return -1 if keys[i] == _EMPTY else edges[vals[i], 1]


@njit(cache=True)
def _add_edge(states, edges, keys, vals, meta, state, token, target):
    e = meta[1]
    meta[1] += 1
    edges[e, 0], edges[e, 1], edges[e, 2] = token, target, states[state, 3]
    states[state, 3] = e
    key = (np.int64(state) << 31) | token
    i = _slot(keys, key)
    keys[i], vals[i] = key, e


@njit(cache=True)
def _extend(states, edges, keys, vals, meta, token, i):
    """The automaton of ctx[:i] becomes that of ctx[:i+1] (ctx[i] = token); the textbook
    construction, each state keeping the first end of its strings."""
    cur, last = meta[0], meta[2]
    meta[0] += 1
    states[cur, 0], states[cur, 2], states[cur, 3] = states[last, 0] + 1, i, -1
    p = last
    while p != -1 and _target(keys, vals, edges, p, token) == -1:
        _add_edge(states, edges, keys, vals, meta, p, token, cur)
        p = states[p, 1]
    if p == -1:
        states[cur, 1] = 0
    else:
        q = _target(keys, vals, edges, p, token)
        if states[p, 0] + 1 == states[q, 0]:
            states[cur, 1] = q
        else:  # split q: its strings up to len(p) + 1 long move to a clone
            clone = meta[0]
            meta[0] += 1
            states[clone, 0], states[clone, 1] = states[p, 0] + 1, states[q, 1]
            states[clone, 2], states[clone, 3] = states[q, 2], -1
            e = states[q, 3]
            while e >= 0:
                _add_edge(states, edges, keys, vals, meta, clone, edges[e, 0], edges[e, 1])
                e = edges[e, 2]
            while p != -1 and _target(keys, vals, edges, p, token) == q:
                edges[vals[_slot(keys, (np.int64(p) << 31) | token)], 1] = clone
                p = states[p, 1]
            states[q, 1] = clone
            states[cur, 1] = clone
    meta[2] = cur


@njit(cache=True)
def _grow(states, edges, keys, vals, meta, token, i, wmax):
    """_extend, and move the tracked state to that of the last min(wmax, i + 1) tokens."""
    _extend(states, edges, keys, vals, meta, token, i)
    v, n = meta[3], meta[4]
    while states[v, 1] >= 0 and states[states[v, 1], 0] >= n:  # split off into a clone
        v = states[v, 1]
    v, n = _target(keys, vals, edges, v, token), n + 1
    if n > wmax:  # one token too long: its suffix is this state's or its link's
        n = wmax
        if states[states[v, 1], 0] >= wmax:
            v = states[v, 1]
    meta[3], meta[4] = v, n


@njit(cache=True)
def _leftmost(states, meta, wmin, wmax):
    """The index after the leftmost earlier occurrence of the longest suffix of length
    wmin..wmax, or -1 (ngram.longest_match's start)."""
    return _longest(states, meta, wmin, wmax)[0]


@njit(cache=True)
def _longest(states, meta, wmin, wmax):
    """ngram.longest_match of the context the automaton holds: (start, n) or (-1, 0)."""
    u = states[meta[2], 1]
    n = states[u, 0] if u > 0 else 0
    if n < wmin:
        return -1, 0
    if n > wmax:
        u, n = meta[3], wmax
    return states[u, 2] + 1, n


@njit(cache=True)
def longest_matches(ctx, first, wmin, wmax):  # ctx: int64[T] -> int64[T + 1, 2]
    """ngram.longest_match(ctx[:t], wmin, wmax) for every t >= first (rows below: (-1, 0)), in
    one pass: what guard and adaptive search the whole context for at every call."""
    out = np.empty((ctx.shape[0] + 1, 2), np.int64)
    out[:, 0], out[:, 1] = -1, 0
    states, edges, keys, vals, meta = _automaton(ctx.shape[0])
    for i in range(ctx.shape[0]):
        _grow(states, edges, keys, vals, meta, ctx[i], i, wmax)
        if i + 1 >= first:
            out[i + 1, 0], out[i + 1, 1] = _longest(states, meta, wmin, wmax)
    return out


# ---- llamacpp-simple: n-grams hashed to their most recent start -------------------------------

_BASE = 1000003
_MASK = (1 << 63) - 1  # table keys are >= 0


@njit(cache=True)
def _replay_recent(ctx, n_prompt, k, size, c, p, out):
    """llamacpp-simple (n-gram `size`, m = k) over one chain; returns the next pass number.
    Every start j of an n-gram that may match (1 <= j <= T - size - 2 at context T) is in the
    table, the latest j per hash."""
    n = ctx.shape[0] - n_prompt
    out[0][c, 0] = max(n - 1, 0)
    if n < 2:
        return p
    prefix, power = _hashes(ctx, size)
    keys, vals = _table(ctx.shape[0])
    added, pos = 1, 1
    while pos < n:
        t = n_prompt + pos
        while added <= t - size - 2:
            h = (prefix[added + size] - prefix[added] * power) & _MASK
            i = _slot(keys, h)
            keys[i], vals[i] = h, added
            added += 1
        start, length = _recent(ctx, t, size, k, keys, vals, prefix, power)
        budget = min(k, n - pos - 1)
        if start < 0 or budget <= 0:
            start, length = -1, 0
        length = min(length, budget)
        a = _accepted(ctx, start, length, t)
        _record(c, p, length, a, out)
        p, pos = p + 1, pos + a + 1
    return p


@njit(cache=True)
def _hashes(ctx, size):
    """(polynomial hashes of every prefix ctx[:i], BASE^size): the n-gram at j hashes to
    prefix[j + size] - prefix[j] * power (int64 arithmetic wraps)."""
    prefix = np.zeros(ctx.shape[0] + 1, np.int64)
    for i in range(ctx.shape[0]):
        prefix[i + 1] = prefix[i] * _BASE + ctx[i] + 1
    power = np.int64(1)
    for _ in range(size):
        power *= _BASE
    return prefix, power


@njit(cache=True)
def _recent(ctx, t, size, m, keys, vals, prefix, power):
    """_most_recent_start(ctx[:t], size, m) from the table."""
    if t - 1 <= size + m + 1:
        return -1, 0
    i = _slot(keys, (prefix[t] - prefix[t - size] * power) & _MASK)
    if keys[i] == _EMPTY:
        return -1, 0
    j = vals[i]
    for d in range(size):
        if ctx[j + d] != ctx[t - size + d]:  # another n-gram with the same hash
            return _most_recent_start(ctx[:t], size, m)
    copy = min(m, t - 1 - (j + size))
    if copy < size:
        return -1, 0
    return j + size, copy


# ---- suffix: the trie on arrays ---------------------------------------------------------------
# A trie is three arrays: nodes int64[capacity, 6] (COUNT..BEST per node, node 0 the root),
# root int64[V] (token -> child of the root, -1: none), meta int64[2 + max_depth] (nodes used,
# live suffixes, then the live suffixes' nodes, oldest first). Kernels take the arrays one by
# one: unpacking a tuple of arrays costs two atomic reference counts per call.


@njit(cache=True)
def _child(nodes, root, node, token):
    """The child of `node` for `token`, or -1."""
    if node == 0:
        return root[token]
    child = nodes[node, FIRST]
    while child >= 0 and nodes[child, TOKEN] != token:
        child = nodes[child, NEXT]
    return child


@njit(cache=True)
def _add_child(nodes, root, meta, node, token):
    child = meta[0]
    meta[0] += 1
    nodes[child] = -1
    nodes[child, COUNT], nodes[child, TOKEN] = 0, token
    if nodes[node, LAST] >= 0:
        nodes[nodes[node, LAST], NEXT] = child
    else:
        nodes[node, FIRST] = child
    nodes[node, LAST] = child
    if node == 0:
        root[token] = child
    return child


@njit(cache=True)
def _count_child(nodes, node, child):
    """One more occurrence of `child`; keep the parent's most frequent child: the highest count,
    the first inserted (lowest index) on ties, as suffix_tree's `_most_frequent_child` picks."""
    nodes[child, COUNT] += 1
    best = nodes[node, BEST]
    if best < 0 or nodes[child, COUNT] > nodes[best, COUNT] or (
            nodes[child, COUNT] == nodes[best, COUNT] and child < best):
        nodes[node, BEST] = child


@njit(cache=True)
def _append(nodes, root, meta, token, max_depth):
    """SuffixTrie.append: every live suffix (at most max_depth) grows by `token`."""
    n_live = meta[1]
    if n_live == max_depth:  # the oldest suffix reached max_depth tokens
        for i in range(2, 1 + max_depth):
            meta[i] = meta[i + 1]
        n_live -= 1
    meta[2 + n_live] = 0
    n_live += 1
    meta[1] = n_live
    nodes[0, COUNT] += 1
    for i in range(2, 2 + n_live):
        node = meta[i]
        if node == 0:
            child = root[token]
        else:  # _child written out: a call between kernels costs more than this scan
            child = nodes[node, FIRST]
            while child >= 0 and nodes[child, TOKEN] != token:
                child = nodes[child, NEXT]
        if child < 0:
            child = _add_child(nodes, root, meta, node, token)
        _count_child(nodes, node, child)
        meta[i] = child


@njit(cache=True)
def _reset(nodes, root, meta):
    """The root only, no live suffix; the root's table entries it had set cleared."""
    child = nodes[0, FIRST]
    while child >= 0:
        root[nodes[child, TOKEN]] = -1
        child = nodes[child, NEXT]
    nodes[0] = -1
    nodes[0, COUNT] = 0
    meta[0], meta[1] = 1, 0


@njit(cache=True)
def _speculate(nodes, root, meta, pattern, max_spec, factor, offset, min_prob, out, path):
    """SuffixTrie.speculate: (length, score) of the best draft, its tokens in out[:length].

    The node spelling the pattern's last L tokens is one of the live suffixes of the sequence
    the pattern ends while L <= their number (no walk from the root), else found by a walk.
    (One function on purpose: numba calls between kernels cost more than this loop's work.)"""
    best_len, best_score, n, n_live = 0, 0.0, pattern.shape[0], meta[1]
    for match_len in range(1, n):
        if match_len <= n_live:
            node = meta[2 + n_live - match_len]
        else:
            node = 0
            for j in range(n - match_len, n):
                node = _child(nodes, root, node, pattern[j])
                if node < 0:
                    break
        if node < 0:
            break  # a longer suffix cannot occur either
        cap = int(match_len * factor + offset + 1e-6)
        limit, length, score, prob = max(min(max_spec, cap), 0), 0, 0.0, 1.0
        while length < limit:  # _speculate_path: the most frequent child, while prob holds
            child = nodes[node, BEST]
            if child < 0:
                break
            prob *= nodes[child, COUNT] / nodes[node, COUNT]
            if prob < min_prob:
                break
            path[length] = nodes[child, TOKEN]
            length, score, node = length + 1, score + prob, child
        if score >= best_score:
            best_len, best_score = length, score
            out[:length] = path[:length]
    return best_len, best_score


@njit(cache=True)
def suffix_replay(tokens, starts, prompt_lens, k, depth, params, cross, local, global_, state,
                  last, out, first):
    """Replay chains first.. with SuffixProposer's rule (its tries `local` and `global_`); returns
    the chain it stopped before because a trie might overflow (the caller grows it and resumes
    there), or the number of chains. params = (max_spec_factor, max_spec_offset,
    min_token_prob); state = [length of the context last seen (in `last`), requests]: for
    SuffixProposer's new-request test, across batches."""
    (l_nodes, l_root, l_meta), (g_nodes, g_root, g_meta) = local, global_
    factor, offset, min_prob = params[0], params[1], params[2]
    n_chains, scalars, pass_starts = prompt_lens.shape[0], out[0], out[5]
    draft, other, path = np.empty(k, np.int64), np.empty(k, np.int64), np.empty(k, np.int64)
    p = pass_starts[first]
    for c in range(first, n_chains):
        ctx, n_prompt = tokens[starts[c] : starts[c + 1]], prompt_lens[c]
        n = ctx.shape[0] - n_prompt
        pass_starts[c], scalars[c, 0] = p, max(n - 1, 0)
        room = ctx.shape[0] * depth  # the most nodes one chain can add to a trie
        if l_meta[0] + room > l_nodes.shape[0] or (
                cross and g_meta[0] + room > g_nodes.shape[0]):
            return c
        if not cross:
            state[0] = 0  # a fresh proposer per chain: always a new request
        pos = 1
        while pos < n:
            t = n_prompt + pos
            if pos == 1:
                _sync_first(ctx, t, k, depth, cross, local, global_, state, last)
            pattern = ctx[max(t - depth, 0) : t]
            length, score = _speculate(l_nodes, l_root, l_meta, pattern, k, factor, offset,
                                       min_prob, draft, path)
            if cross:  # the global tree's draft wins if it scores strictly higher
                g_length, g_score = _speculate(g_nodes, g_root, g_meta, pattern, k, factor,
                                               offset, min_prob, other, path)
                if g_score > score:
                    length = g_length
                    draft[:length] = other[:length]
            length, a = min(length, max(min(k, n - pos - 1), 0)), 0
            while a < length and draft[a] == ctx[t + a]:
                a += 1
            _record(c, p, length, a, out)
            for i in range(t, t + a + 1):  # observe: the context grew by a + 1 tokens
                _append(l_nodes, l_root, l_meta, ctx[i], depth)
                if cross:
                    _append(g_nodes, g_root, g_meta, ctx[i], depth)
            p, pos = p + 1, pos + a + 1
        if n > 1:
            state[0] = ctx.shape[0]
            last[: ctx.shape[0]] = ctx
    pass_starts[n_chains] = p
    return n_chains


@njit(cache=True)
def _sync_first(ctx, t, k, depth, cross, local, global_, state, last):
    """SuffixProposer._sync at a chain's first call: the same request if the context is the last
    one seen grown by at most k + 1 tokens, else a new request (a fresh local tree, a new
    sequence in the global tree that starts at the context's last token)."""
    (l_nodes, l_root, l_meta), (g_nodes, g_root, g_meta) = local, global_
    seen = state[0]
    grown = 0 < seen <= t <= seen + k + 1
    for i in range(seen if grown else 0):
        if ctx[i] != last[i]:
            grown = False
            break
    if not grown:
        state[1] += 1
        _reset(l_nodes, l_root, l_meta)
        g_meta[1] = 0  # the new sequence has no live suffixes yet
    first = seen if grown else 0
    for i in range(first, t):
        _append(l_nodes, l_root, l_meta, ctx[i], depth)
    if cross:
        for i in range(first if grown else t - 1, t):
            _append(g_nodes, g_root, g_meta, ctx[i], depth)


# ---- the compiled cache follows the proposers' kernels ---------------------------------------


def _sources_digest() -> str:
    """Digest of the proposer kernels compiled into the replays: numba's cache only notices
    changes to this file, so a change there must drop the cached replays."""
    text = "".join(inspect.getsource(f.py_func) for f in
                   (longest_match, _first_match_start, _most_recent_start))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _refresh_cache() -> None:
    """Drop the replays' cached machine code when the proposers' kernels changed since it was
    compiled (a stamp file beside numba's cache records their digest)."""
    kernels = (ngram_replay, _replay_recent, _recent)
    try:
        folder = Path(kernels[0]._cache._cache_path)
    except AttributeError:  # another numba: no cache to refresh
        return
    stamp, digest = folder / "kolibri-replays.deps", _sources_digest()
    try:
        if stamp.read_text() == digest:
            return
    except OSError:
        pass
    try:
        make_private(folder)  # numba makes it only when it saves
        for kernel in kernels:
            kernel._cache.flush()
        stamp.write_text(digest)
    except OSError:
        pass  # a read-only install: compiled in memory each run


_refresh_cache()
