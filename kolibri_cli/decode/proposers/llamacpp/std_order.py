"""The iteration order of libstdc++'s `std::unordered_map<int32_t, int32_t>`, emulated.

llama.cpp's ngram-cache picks the most frequent next token with a strict `>` while iterating such
a map, so among equally frequent tokens the first one *iterated* wins. To draft what llama.cpp
drafts, kolibri iterates in the same order. libstdc++ (GCC 12, the compiler of the llama.cpp
binaries this was checked against) keeps one singly linked list of all nodes, grouped by bucket
(hash = the token itself, bucket = token % bucket count): a key whose bucket is empty starts a new
group at the FRONT of the list, any other key goes to the front of its bucket's group. When an
insert would exceed the bucket count (max load factor 1), the table grows to the next size of
`GROWTH` and relinks the old list in order under the same two rules. Copies keep the order.
`tests/test_llamacpp_types.py` checks this against a compiled std::unordered_map when g++ exists.
Non-goals: erasure (llama.cpp never erases tokens from a count map), other standard libraries.
"""

# Bucket counts an insert-only table passes through (GCC 12: _Prime_rehash_policy from an empty
# table), measured with a compiled program; the vocabularies of interest stay far below the end.
GROWTH = (13, 29, 59, 127, 257, 541, 1109, 2357, 5087, 10273, 20753, 42043, 85229, 172933,
          351061)


class StdCounts:
    """token -> count, iterated (`items()`) in libstdc++'s order for the same inserts."""

    __slots__ = ("counts", "_groups", "_order", "_buckets", "_growth")

    def __init__(self):
        self.counts: dict[int, int] = {}
        self._buckets = 0  # 0: nothing allocated yet (the first insert allocates GROWTH[0])
        self._growth = 0  # index of the next size in GROWTH
        self._order: list[int] = []  # bucket ids, LAST = front of the list
        self._groups: dict[int, list[int]] = {}  # bucket -> tokens, LAST = front of its group

    def add(self, token: int, count: int = 1) -> None:
        """counts[token] += count, inserting the token (count) if new: `emplace` or `++`."""
        if token in self.counts:
            self.counts[token] += count
            return
        if len(self.counts) + 1 > self._buckets:
            self._rehash(GROWTH[self._growth])
            self._growth += 1
        self.counts[token] = count
        self._link(token)

    def items(self):
        """(token, count) pairs in iteration order."""
        counts = self.counts
        for bucket in reversed(self._order):
            for token in reversed(self._groups[bucket]):
                yield token, counts[token]

    def get(self, token: int, default=None):
        return self.counts.get(token, default)

    def __len__(self) -> int:
        return len(self.counts)

    def _rehash(self, buckets: int) -> None:
        old = [token for token, _ in self.items()]
        self._buckets, self._order, self._groups = buckets, [], {}
        for token in old:
            self._link(token)

    def _link(self, token: int) -> None:
        bucket = token % self._buckets
        group = self._groups.get(bucket)
        if group is None:
            self._groups[bucket] = [token]
            self._order.append(bucket)
        else:
            group.append(token)
