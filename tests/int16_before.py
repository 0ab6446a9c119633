"""The int16 path's arithmetic, written out once per (row, token) from the GGUF's own blocks:
the oracle every tile of `kolibri_cli.engine.int16` must match bitwise, since the path's
measured fidelity and its batch invariance were established on these bits. Its own code (no
repacking, no tiles; integer sums in int64, numpy's IEEE float32 products; the vector FMA and
the 8-lane tree from frozen copies in simd8_before, not the engine's); compared only through
`reference_matmul`.

The arithmetic (since the lane-per-block layout; the path's first tiles summed each pair of
blocks' runs of 4 values per lane): a row's blocks in groups of 8 (the last of 4 and 2); lane i
of a group of n blocks belongs to block b = i*n/8 and, for each run r of 16 values, sums the
exact products of that block's values 16r + 2(c*8/n + i % (8/n)) + e (c < n, e < 2); per group
the FMA chain of 8 lanes takes, in order, Q4_1's m * s_x (lanes < n), then per run
float(sum) * (d_b * d_x[b, r]); then the tree of 8 lanes."""

import numpy as np
from numba import njit
from simd8_before import fload, vfma8, vsum8, vzero8

from kolibri_cli.engine import jitcache  # noqa: F401  (before the @njit(cache=True))

SUB = 16  # activations per scale


def _blocks(q4: bool, rows: np.ndarray):
    """rows [N, row bytes] -> (d [N, B] float32, m [N, B] float32 or zeros, codes [N, B, 32]
    int64), B even (an odd count gets a zero block)"""
    nbytes = 20 if q4 else 34
    blocks = rows.reshape(rows.shape[0], -1, nbytes)
    if blocks.shape[1] % 2:
        blocks = np.concatenate([blocks, np.zeros_like(blocks[:, :1])], axis=1)
    scales = blocks[:, :, :4 if q4 else 2].copy().view(np.float16).astype(np.float32)
    qs = blocks[:, :, 4 if q4 else 2:]
    if q4:
        codes = np.concatenate([qs & 15, qs >> 4], axis=-1).astype(np.int64)
        return scales[:, :, 0], scales[:, :, 1], codes
    return scales[:, :, 0], np.zeros_like(scales[:, :, 0]), qs.view(np.int8).astype(np.int64)


def _activations(x: np.ndarray, n_blocks: int):
    """x [L, K] -> (codes [L, B, 32] int64, d [L, B, 2] float32, s_x [L, B] float32)"""
    xp = np.zeros((x.shape[0], 32 * n_blocks), np.float32)
    xp[:, :x.shape[1]] = x
    runs = xp.reshape(x.shape[0], n_blocks, 2, SUB)
    d = (np.abs(runs).max(axis=3) / np.float32(32767)).astype(np.float32)
    with np.errstate(divide="ignore", over="ignore"):
        inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    inv[~np.isfinite(inv)] = 0
    d[inv == 0] = 0
    codes = np.rint(runs * inv[..., None]).astype(np.int64)
    sums = codes.sum(axis=3).astype(np.float32)  # [L, B, 2]
    s_x = np.float32(0) + d[:, :, 0] * sums[:, :, 0]
    s_x = s_x + d[:, :, 1] * sums[:, :, 1]
    return codes.reshape(x.shape[0], n_blocks, 32), d, s_x.astype(np.float32)


def _groups(n_blocks: int) -> list[tuple[int, int]]:
    """(first block, blocks) of each group of a row"""
    out, b = [], 0
    while b < n_blocks:
        n = 8 if n_blocks - b >= 8 else 4 if n_blocks - b >= 4 else 2
        out.append((b, n))
        b += n
    return out


def _lane_values(n: int) -> np.ndarray:
    """[8, RUNS=2, n*2] (block offset, value) flat indices 32 b + v each lane sums per run"""
    per = 8 // n
    out = np.zeros((8, 2, 2 * n), np.int64)
    for i in range(8):
        b, j = divmod(i, per)
        for r in range(2):
            vals = [SUB * r + 2 * (c * per + j) + e for c in range(n) for e in range(2)]
            out[i, r] = [32 * b + v for v in vals]
    return out


@njit(cache=True)
def _finish(terms, scales):
    """terms, scales [L, N, S, 8] float32 -> [L, N]: per (token, row) the FMA chain over S
    steps of 8 lanes, then the tree of 8"""
    n_tok, n_rows, steps = terms.shape[0], terms.shape[1], terms.shape[2]
    out = np.zeros((n_tok, n_rows), np.float32)
    for t in range(n_tok):
        for r in range(n_rows):
            acc = vzero8()
            for s in range(steps):
                acc = vfma8(fload(terms[t, r, s], 0), fload(scales[t, r, s], 0), acc)
            out[t, r] = vsum8(acc)
    return out


def reference_matmul(q4: bool, rows: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The GGUF's rows [N, row bytes] of Q4_1 (q4) or Q8_0 blocks . x [L, K] -> [L, N]"""
    d, m, w = _blocks(q4, rows)  # [N, B], [N, B], [N, B, 32]
    n_blocks = d.shape[1]
    xq, dx, s_x = _activations(np.asarray(x, np.float32), n_blocks)
    terms, scales = [], []  # per step: [L, N, 8]
    n_tok, n_rows = x.shape[0], rows.shape[0]
    for b0, n in _groups(n_blocks):
        if q4:  # lanes < n: m * s_x of the group's blocks
            mm = np.zeros((n_tok, n_rows, 8), np.float32)
            sx = np.zeros((n_tok, n_rows, 8), np.float32)
            mm[:, :, :n] = m[None, :, b0:b0 + n]
            sx[:, :, :n] = s_x[:, None, b0:b0 + n]
            terms.append(mm)
            scales.append(sx)
        wg = w[:, b0:b0 + n].reshape(n_rows, 32 * n)  # [N, 32n]
        xg = xq[:, b0:b0 + n].reshape(n_tok, 32 * n)  # [L, 32n]
        lanes = _lane_values(n)
        block = np.arange(8) * n // 8  # each lane's block in the group
        for r in range(2):
            isum = np.einsum("nlv,tlv->tnl", wg[:, lanes[:, r]], xg[:, lanes[:, r]])
            assert np.abs(isum).max(initial=0) < 2**31
            terms.append(isum.astype(np.float32))
            scales.append((d[None, :, b0 + block] * dx[:, None, b0 + block, r]).astype(
                np.float32))
    return _finish(np.ascontiguousarray(np.stack(terms, axis=2)),
                   np.ascontiguousarray(np.stack(scales, axis=2)))
