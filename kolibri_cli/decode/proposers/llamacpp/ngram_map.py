"""llama.cpp's `ngram-map-k` and `ngram-map-k4v`: a map from key n-grams to the m-grams that
followed them, kept across the requests a server slot serves.

A line-by-line port of common/ngram-map.cpp (`common_ngram_map_begin`, `common_ngram_map_draft`,
`common_ngram_map_accept`), with its integer widths and quirks: positions are indices into the
token history of the request being served, so state kept from an earlier request is checked
against the current one's tokens (as upstream does); a 2^18-entry hash of n-gram -> position
(first writer wins) speeds up the search; a key's draft length is capped by the tokens accepted
the last time it drafted. Where upstream would read past the end of the history (stale positions
from a longer earlier request), the comparison fails here.
"""

from dataclasses import dataclass, field

import numpy as np

HASH_SIZE = 262144  # COMMON_NGRAM_HASH_MAP_SIZE
MAX_VALUES = 4  # COMMON_NGRAM_MAX_VALUES
MAX_COUNT = 16380  # COMMON_NGRAM_MAX_VALUE_COUNT
LCG_FACTOR = 2654435761
MASK32 = 0xFFFFFFFF


@dataclass
class Value:
    """An m-gram seen after a key (`common_ngram_map_value`)."""

    value_idx: int = 0  # position of the m-gram in the history (0: unused slot)
    value_num: int = 0  # occurrences after the key
    n_accepted: int = -1  # tokens accepted the last time this value drafted


@dataclass
class Key:
    """A key n-gram and its statistics (`common_ngram_map_key`)."""

    key_idx: int  # position of the key in the history
    stat_idx: int = 0  # statistics cover occurrences up to this position
    key_num: int = 0  # times the key was looked up with a match
    values: list[Value] = field(default_factory=list)


def ngram_hash(tokens, start: int, n: int) -> int:
    """`common_ngram_map_hash` (uint32 LCG) modulo the hash table size."""
    h = 0
    for i in range(n):
        h = (h * LCG_FACTOR + tokens[start + i]) & MASK32
    return h % HASH_SIZE


class NgramMap:
    """`common_ngram_map`: one server slot's map, alive for the server's lifetime."""

    def __init__(self, size_key: int, size_value: int, key_only: bool, min_hits: int):
        self.n, self.m, self.key_only, self.min_hits = size_key, size_value, key_only, min_hits
        self.keys: list[Key] = []
        self.size_last_begin = 0  # prompt length at the last request's start
        self.last_draft_created = False
        self.last_draft_key_idx = 0
        self.last_draft_value_idx = 0
        self.idx_last_check = 0  # history length at the last call
        self.key_map = np.zeros(HASH_SIZE, np.uint32)  # hash -> position of an n-gram (0: none)
        self.key_map_last_idx = 0  # positions up to here are in key_map
        # `keys` by their text in this request's history (the first index of equal ones): the
        # scan of `common_ngram_map_draft`, by lookup; None: scan (a key reaches past the
        # history's end), rebuilt at each request
        self._offsets: dict[tuple, int] | None = None
        self._rebuild = True

    def begin(self, prompt: list[int]) -> None:
        """`common_ngram_map_begin`: a new request; forget positions the new prompt may not
        share with the old history (only when it is shorter than the last history)."""
        n, m, size_begin = self.n, self.m, len(prompt)
        cleanup = self.size_last_begin
        if cleanup > size_begin:
            cleanup = size_begin - n - m if size_begin > n + m else 0
        if size_begin < self.idx_last_check:
            self.key_map[self.key_map >= max(cleanup, 1)] = 0
            self.key_map_last_idx = cleanup - 1 if cleanup > 0 else 0
            self._drop_keys_from(cleanup)
        self.idx_last_check = size_begin
        self.size_last_begin = size_begin
        self._rebuild = True  # positions now index another history

    def _drop_keys_from(self, cleanup: int) -> None:
        for i in range(len(self.keys) - 1, -1, -1):
            key = self.keys[i]
            if key.key_idx >= cleanup:
                del self.keys[i]
                continue
            if self.key_only:
                continue
            for j in range(MAX_VALUES - 1, -1, -1):
                if 0 != key.values[j].value_idx >= cleanup:
                    key.values[j:] = key.values[j + 1:] + [_cleared(key.values[-1])]
            if key.values[0].value_idx == 0:
                del self.keys[i]

    def draft(self, inp: list[int], sampled: int, cur_len: int | None = None) -> list[int]:
        """`common_ngram_map_draft`: the draft for history inp[:cur_len] (default: all of
        `inp`; a replay passes its whole chain once) followed by `sampled`."""
        self.last_draft_created, self.last_draft_key_idx, self.last_draft_value_idx = False, 0, 0
        n, m = self.n, self.m
        cur_len = len(inp) if cur_len is None else cur_len
        if cur_len < 2 * n + m:
            return []
        if self.idx_last_check > cur_len:
            raise AssertionError("ngram-map: history shorter than at the last call "
                                 "(a new request must call begin first)")
        self.idx_last_check = cur_len
        key = inp[cur_len - n + 1:cur_len] + [sampled]
        match_pos = self._find(inp, cur_len, key)
        self._index(inp, cur_len)
        if match_pos == 0:
            return []
        offset = self._key_offset(inp, cur_len, key, match_pos)
        curr = self.keys[offset]
        curr.key_num = min(curr.key_num + 1, MAX_COUNT)
        if self.key_only:
            return self._use(inp, match_pos, offset, 0)
        if curr.key_num < self.min_hits:
            return []
        slot = self._best_value(inp, cur_len, key, curr, match_pos)
        return [] if slot is None else self._use(inp, match_pos, offset, slot)

    def accept(self, n_accepted: int) -> None:
        """`common_ngram_map_accept`: the next draft of this value is capped at n_accepted."""
        if self.last_draft_created:
            value = self.keys[self.last_draft_key_idx].values[self.last_draft_value_idx]
            value.n_accepted = _int16(n_accepted)

    def _find(self, inp, cur_len: int, key) -> int:
        """The key's position: from the hash table, else the newest occurrence before the
        request's start, else the newest one after it; 0 = none (position 0 is never used)."""
        n, m = self.n, self.m
        idx = int(self.key_map[ngram_hash(key, 0, n)])
        if idx != 0 and idx < cur_len - n - m - 1 and _equal(inp, cur_len, idx, key):
            return idx
        if self.size_last_begin > n + m + 1:
            for j in range(self.size_last_begin - n - m - 1, self.key_map_last_idx, -1):
                if _equal(inp, cur_len, j, key):
                    return j
        low = max(self.size_last_begin, self.key_map_last_idx)
        for j in range(cur_len - n - m - 1, low, -1):
            if _equal(inp, cur_len, j, key):
                return j
        return 0

    def _index(self, inp, cur_len: int) -> None:
        """Add the positions not yet hashed to key_map, in the same order as `_find` searches."""
        n, m = self.n, self.m
        if self.size_last_begin > n + m + 1:
            for j in range(self.size_last_begin - n - m - 1, self.key_map_last_idx, -1):
                self._remember(inp, j)
        low = max(self.size_last_begin, self.key_map_last_idx)
        for j in range(cur_len - n - m - 1, low, -1):
            self._remember(inp, j)
        self.key_map_last_idx = max((cur_len - n - m - 1) & MASK32, self.key_map_last_idx)

    def _remember(self, inp, j: int) -> None:
        h = ngram_hash(inp, j, self.n)
        if self.key_map[h] == 0:
            self.key_map[h] = j

    def _key_offset(self, inp, cur_len: int, key, match_pos: int) -> int:
        """Index of the key's statistics in `keys` (the first whose text in the history is the
        key), appended if new."""
        offsets = self._key_offsets(inp, cur_len)
        if offsets is None:
            for i, k in enumerate(self.keys):
                if _equal(inp, cur_len, k.key_idx, key):
                    return i
        elif tuple(key) in offsets:
            return offsets[tuple(key)]
        values = [Value(n_accepted=self.m) for _ in range(MAX_VALUES)]
        self.keys.append(Key(key_idx=match_pos, values=values))
        if offsets is not None:
            offsets[tuple(key)] = len(self.keys) - 1
        return len(self.keys) - 1

    def _key_offsets(self, inp, cur_len: int) -> dict[tuple, int] | None:
        """The keys by their text in inp[:cur_len], made at a request's first lookup: within
        a request the history only grows, so a key's text stays. None when a kept key reaches
        past the history's end (its text is not there yet: the request scans, as upstream)."""
        if self._rebuild:
            self._rebuild, self._offsets = False, {}
            for i, k in enumerate(self.keys):
                if k.key_idx + self.n > cur_len:
                    self._offsets = None
                    break
                self._offsets.setdefault(tuple(inp[k.key_idx:k.key_idx + self.n]), i)
        return self._offsets

    def _best_value(self, inp, cur_len: int, key, curr: Key, match_pos: int) -> int | None:
        """k4v: count the m-grams after each occurrence of the key since the last count; the
        slot of the most frequent one if it is at least twice as frequent as all others."""
        n, m = self.n, self.m
        for i in range(curr.stat_idx, match_pos + 1):
            if not _equal(inp, cur_len, i, key):
                continue
            slot = self._value_slot(inp, cur_len, curr, i + n, m)
            if slot is not None:
                curr.values[slot].value_num = min(curr.values[slot].value_num + 1, MAX_COUNT)
        curr.stat_idx = match_pos
        best, most = 0, 0
        for v, value in enumerate(curr.values):
            if value.value_num > most:
                best, most = v, value.value_num
        others = sum(value.value_num for v, value in enumerate(curr.values) if v != best)
        return None if others > 0 and most < 2 * others else best

    @staticmethod
    def _value_slot(inp, cur_len: int, curr: Key, begin: int, m: int) -> int | None:
        for v, value in enumerate(curr.values):
            if value.value_idx == 0:  # a new m-gram after this key
                value.value_idx, value.value_num, value.n_accepted = begin, 0, m
                return v
            if _equal(inp, cur_len, value.value_idx, inp[begin:min(begin + m, cur_len)]):
                return v
        return None

    def _use(self, inp, match_pos: int, offset: int, slot: int) -> list[int]:
        """Draft the tokens after the matched key (whichever value was chosen), at most m and at
        most what this value got accepted last time."""
        count = min(self.m, self.keys[offset].values[slot].n_accepted)
        self.last_draft_created, self.last_draft_key_idx = True, offset
        self.last_draft_value_idx = slot
        start = match_pos + self.n
        return inp[start:start + max(count, 0)]


def _equal(inp, cur_len: int, start: int, tokens) -> bool:
    """inp[start : start + len(tokens)] == tokens (False if the history inp[:cur_len] ends
    first)."""
    end = start + len(tokens)
    return inp[start:min(end, cur_len)] == list(tokens)


def _cleared(value: Value) -> Value:
    return Value(0, 0, value.n_accepted)


def _int16(x: int) -> int:
    x &= 0xFFFF
    return x - 0x10000 if x >= 0x8000 else x
