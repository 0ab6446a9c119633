"""Compiled replays: the Definitions' loop over whole batches of chains inside numba, no Python per
verify pass, for the proposers that have one (vllm, hf, llamacpp-simple, suffix).

Each replay gives exactly the counts of the reference loop (simulate.simulate_chain over the
proposer's `propose`/`observe`), which tests check on thousands of chains. The n-gram replays
call the proposers' own search kernels, so a change to a rule reaches both paths; the suffix
replay re-implements the trie of decode/proposers/suffix_tree.py on arrays.
Non-goals: proposers without a replay here (the generic path runs them), reading goldens.
"""

import hashlib
import inspect
from pathlib import Path

import numpy as np
from numba import njit

from kolibri_cli.decode.proposers.llamacpp import _most_recent_start
from kolibri_cli.decode.proposers.ngram import _first_match_start, longest_match

VLLM, HF, LLAMACPP = 0, 1, 2  # the n-gram replay's rule
SCALARS = ("plain_steps", "verify_passes", "drafts_proposed", "drafts_accepted",
           "passes_with_drafts")  # the columns of `scalars` below
# trie node fields: occurrences, first/last child, next sibling, token, most frequent child
COUNT, FIRST, LAST, NEXT, TOKEN, BEST = range(6)


@njit(cache=True)
def _record(c, p, drafted, accepted, scalars, drafted_at, accepted_at, lengths, accepts):
    """One verify pass of chain c (pass number p of the batch)."""
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
def _ngram_draft(ctx, t, budget, rule, k, wmin, wmax, eos):  # ctx: int64[T'] -> (start, length)
    """The draft for context ctx[:t] as (start in ctx, length): what the proposer's `propose`
    returns, cut to `budget`."""
    if rule == VLLM:
        if budget <= 0:
            return -1, 0
        start = longest_match(ctx[:t], wmin, wmax)[0]
        return start, (min(budget, t - start) if start >= 0 else 0)
    if rule == HF:
        start = _first_match_start(ctx[:t], wmin, wmax)
        if start < 0 or budget <= 0:
            return -1, 0
        length = min(k, t - start)
        for i in range(length):  # cut before the first eos
            for e in eos:
                if ctx[start + i] == e:
                    return start, min(i, budget)
        return start, min(length, budget)
    start, length = _most_recent_start(ctx[:t], wmax, k)
    if start < 0 or budget <= 0:
        return -1, 0
    return start, min(length, budget)


@njit(cache=True)
def ngram_replay(tokens, starts, prompt_lens, eos, eos_starts, rule, k, wmin, wmax,
                 scalars, drafted_at, accepted_at, lengths, accepts, pass_starts):
    """Replay every chain c = tokens[starts[c]:starts[c+1]] (prompt_lens[c] prompt ids, then the
    output) with an n-gram rule; counts into scalars[c], drafted_at[c], accepted_at[c] and the
    per-pass draft/accepted lengths from pass_starts[c]."""
    p = 0
    for c in range(prompt_lens.shape[0]):
        ctx = tokens[starts[c] : starts[c + 1]]
        chain_eos = eos[eos_starts[c] : eos_starts[c + 1]]
        n_prompt = prompt_lens[c]
        n = ctx.shape[0] - n_prompt
        pass_starts[c] = p
        scalars[c, 0] = max(n - 1, 0)
        pos = 1
        while pos < n:
            t = n_prompt + pos
            start, length = _ngram_draft(ctx, t, min(k, n - pos - 1), rule, k, wmin, wmax,
                                         chain_eos)
            a = 0
            while a < length and ctx[start + a] == ctx[t + a]:
                a += 1
            _record(c, p, length, a, scalars, drafted_at, accepted_at, lengths, accepts)
            p += 1
            pos += a + 1
    pass_starts[prompt_lens.shape[0]] = p


# ---- suffix: the trie on arrays ---------------------------------------------------------------


@njit(cache=True)
def _child(nodes, root_children, node, token):
    """The child of `node` for `token`, or -1 (the root's children are a dense table)."""
    if node == 0:
        return root_children[token]
    child = nodes[node, FIRST]
    while child >= 0 and nodes[child, TOKEN] != token:
        child = nodes[child, NEXT]
    return child


@njit(cache=True)
def _add_child(nodes, size, root_children, node, token):
    child = size[0]
    size[0] += 1
    nodes[child, COUNT] = 0
    nodes[child, FIRST] = -1
    nodes[child, LAST] = -1
    nodes[child, NEXT] = -1
    nodes[child, TOKEN] = token
    nodes[child, BEST] = -1
    if nodes[node, LAST] >= 0:
        nodes[nodes[node, LAST], NEXT] = child
    else:
        nodes[node, FIRST] = child
    nodes[node, LAST] = child
    if node == 0:
        root_children[token] = child
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
def _append(nodes, size, root_children, live, n_live, token, max_depth):
    """SuffixTrie.append: every live suffix (live[:n_live], at most max_depth) grows by `token`;
    returns the new number of live suffixes."""
    if n_live == max_depth:
        for i in range(max_depth - 1):  # the oldest suffix reached max_depth tokens
            live[i] = live[i + 1]
        n_live -= 1
    live[n_live] = 0
    n_live += 1
    nodes[0, COUNT] += 1
    for i in range(n_live):
        node = live[i]
        child = _child(nodes, root_children, node, token)
        if child < 0:
            child = _add_child(nodes, size, root_children, node, token)
        _count_child(nodes, node, child)
        live[i] = child
    return n_live


@njit(cache=True)
def _reset(nodes, size, root_children):
    """An empty trie (the root only); clears the root's table entries it had set."""
    child = nodes[0, FIRST] if size[0] > 0 else -1
    while child >= 0:
        root_children[nodes[child, TOKEN]] = -1
        child = nodes[child, NEXT]
    size[0] = 1
    for f in range(6):
        nodes[0, f] = -1
    nodes[0, COUNT] = 0


@njit(cache=True)
def _speculate(nodes, root_children, pattern, live, n_live, max_spec, factor, offset, min_prob,
               out, path):
    """SuffixTrie.speculate: (length, score) of the best draft, its tokens in out[:length].

    The node spelling the pattern's last L tokens is live[n_live - L] while L <= n_live (the
    live suffixes of the sequence the pattern ends: no walk from the root), else found by one."""
    best_len, best_score = 0, 0.0
    n = pattern.shape[0]
    for match_len in range(1, n):
        if match_len <= n_live:
            node = live[n_live - match_len]
        else:
            node = 0
            for j in range(n - match_len, n):
                node = _child(nodes, root_children, node, pattern[j])
                if node < 0:
                    break
        if node < 0:
            break  # a longer suffix cannot occur either
        cap = int(match_len * factor + offset + 1e-6)
        limit = max(min(max_spec, cap), 0)
        length, score, prob = 0, 0.0, 1.0
        while length < limit:
            child = nodes[node, BEST]
            if child < 0:
                break
            prob *= nodes[child, COUNT] / nodes[node, COUNT]
            if prob < min_prob:
                break
            path[length] = nodes[child, TOKEN]
            length += 1
            score += prob
            node = child
        if score >= best_score:
            best_len, best_score = length, score
            out[:length] = path[:length]
    return best_len, best_score


@njit(cache=True)
def suffix_replay(tokens, starts, prompt_lens, k, max_depth, factor, offset, min_prob, cross,
                  local, local_size, global_, global_size, root_local, root_global, live, state,
                  last, scalars, drafted_at, accepted_at, lengths, accepts, pass_starts, first):
    """Replay chains first.. with SuffixProposer's rule; returns the chain it stopped before
    (the global trie needs room: the caller grows it and resumes there) or the number of chains.

    state = [seen length, live local suffixes, live global suffixes, requests]; `last` holds
    the context last seen (the previous chain's), for SuffixProposer's new-request test."""
    n_chains = prompt_lens.shape[0]
    draft = np.empty(k, dtype=np.int64)
    other = np.empty(k, dtype=np.int64)
    path = np.empty(k, dtype=np.int64)
    live_global = live[max_depth:]
    p = pass_starts[first]
    for c in range(first, n_chains):
        ctx = tokens[starts[c] : starts[c + 1]]
        n_prompt = prompt_lens[c]
        n = ctx.shape[0] - n_prompt
        pass_starts[c] = p
        room = ctx.shape[0] * max_depth  # the most nodes one chain can add to a trie
        if local_size[0] + room > local.shape[0] or (
                cross and global_size[0] + room > global_.shape[0]):
            return c
        if not cross:
            state[0] = 0  # a fresh proposer per chain: always a new request
        scalars[c, 0] = max(n - 1, 0)
        pos = 1
        while pos < n:
            t = n_prompt + pos
            if pos == 1:
                _sync_first(ctx, t, k, max_depth, cross, local, local_size, global_, global_size,
                            root_local, root_global, live, live_global, state, last)
            budget = min(k, n - pos - 1)
            pattern = ctx[max(t - max_depth, 0) : t]
            length, score = _speculate(local, root_local, pattern, live, state[1], k, factor,
                                       offset, min_prob, draft, path)
            if cross:
                g_length, g_score = _speculate(global_, root_global, pattern, live_global,
                                               state[2], k, factor, offset, min_prob, other, path)
                if g_score > score:
                    length = g_length
                    draft[:length] = other[:length]
            length = min(length, max(budget, 0))
            a = 0
            while a < length and draft[a] == ctx[t + a]:
                a += 1
            _record(c, p, length, a, scalars, drafted_at, accepted_at, lengths, accepts)
            p += 1
            for i in range(t, t + a + 1):  # observe: the context grew by a + 1 tokens
                state[1] = _append(local, local_size, root_local, live, state[1], ctx[i],
                                   max_depth)
                if cross:
                    state[2] = _append(global_, global_size, root_global, live_global,
                                       state[2], ctx[i], max_depth)
            pos += a + 1
        if n > 1:
            state[0] = ctx.shape[0]
            last[: ctx.shape[0]] = ctx
    pass_starts[n_chains] = p
    return n_chains


@njit(cache=True)
def _sync_first(ctx, t, k, max_depth, cross, local, local_size, global_, global_size,
                root_local, root_global, live, live_global, state, last):
    """SuffixProposer._sync at a chain's first call: the same request if the context is the last
    one seen grown by at most k + 1 tokens, else a new request."""
    seen = state[0]
    grown = 0 < seen <= t <= seen + k + 1
    if grown:
        for i in range(seen):
            if ctx[i] != last[i]:
                grown = False
                break
    if grown:
        first = seen
    else:
        state[3] += 1
        _reset(local, local_size, root_local)
        state[1] = 0
        state[2] = 0  # a new sequence in the global trie: no live suffixes yet
        first = 0
    for i in range(first, t):
        state[1] = _append(local, local_size, root_local, live, state[1], ctx[i], max_depth)
    if cross:
        for i in range(t - 1 if not grown else first, t):
            state[2] = _append(global_, global_size, root_global, live_global, state[2], ctx[i],
                               max_depth)


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
    kernels = (ngram_replay, _ngram_draft)
    try:
        folder = Path(kernels[0]._cache._cache_path)
    except AttributeError:  # another numba: no cache to refresh
        return
    stamp, digest = folder / "kolibri-fast.deps", _sources_digest()
    try:
        if stamp.read_text() == digest:
            return
    except OSError:
        pass
    for kernel in kernels:
        kernel._cache.flush()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        stamp.write_text(digest)
    except OSError:
        pass  # a read-only install: compiled in memory each run


_refresh_cache()
