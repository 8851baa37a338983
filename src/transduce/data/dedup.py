"""A bounded memory of 64-bit keys for the duplicate rules of :mod:`transduce.data.clean`.

Two open-addressing hash tables (numpy, linear probing, vectorised over a chunk of keys), each
of a fixed size and at most half full: new keys go into the current one; when it is half full
the older one is emptied and becomes the current one. So memory is fixed (``memory_mb``) and
every key is compared with at least the last ``slots / 2`` keys added (the older table's, and
the current one's), never fewer.
"""

from __future__ import annotations

import logging

import numpy as np

logger = logging.getLogger(__name__)


class KeyMemory:
    """Which keys were seen before, remembering at least the last ``capacity`` of them (``memory_mb`` in all)."""

    def __init__(self, memory_mb: int):
        slots = 1 << max(4, (memory_mb * 2**20 // 16).bit_length() - 1)  # two tables of 8-byte slots
        self.tables = [np.zeros(slots, np.uint64), np.zeros(slots, np.uint64)]
        self.filled = 0  # keys in tables[0], the current one
        self.capacity = slots // 2
        self.forgets = 0  # times the older table was emptied

    def seen(self, keys: np.ndarray) -> np.ndarray:
        """For each row of ``keys`` (N, K) in order: whether any of its keys (nonzero uint64) was
        added before, by an earlier call or an earlier row; then adds them all.

        Shape: keys (N, K) -> (N,) bool.
        """
        n, k = keys.shape
        if n == 0 or k == 0:
            return np.zeros(n, bool)
        flat = keys.reshape(-1)
        unique, first, inverse = np.unique(flat, return_index=True, return_inverse=True)
        before = self._contains(unique)
        row = np.arange(flat.size) // k
        earlier = (first[inverse] // k) < row  # the key's first row in this chunk is an earlier one
        dup = (before[inverse] | earlier).reshape(n, k).any(axis=1)
        self._add(unique[~before])
        return dup

    def _contains(self, keys: np.ndarray) -> np.ndarray:
        found = np.zeros(keys.size, bool)
        for table in self.tables:
            found |= _lookup(table, keys)
        return found

    def _add(self, keys: np.ndarray) -> None:
        if self.filled + keys.size > self.capacity:
            self.tables.reverse()  # the older table is emptied and becomes the current one
            self.tables[0].fill(0)
            self.forgets += 1
            logger.debug("duplicate memory full: forgetting the keys before the last %d", self.filled)
            self.filled = 0
        keys = keys[: self.capacity]
        _insert(self.tables[0], keys)
        self.filled += keys.size


def _slots(table: np.ndarray, keys: np.ndarray) -> np.ndarray:
    return (keys >> np.uint64(7)).astype(np.int64) & (table.size - 1)


def _lookup(table: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Whether each key is in ``table`` (probing until the key or an empty slot)."""
    found = np.zeros(keys.size, bool)
    index = _slots(table, keys)
    active = np.arange(keys.size)
    while active.size:
        slot = table[index[active]]
        hit = slot == keys[active]
        found[active[hit]] = True
        active = active[~hit & (slot != 0)]
        index[active] = (index[active] + 1) & (table.size - 1)
    return found


def _insert(table: np.ndarray, keys: np.ndarray) -> None:
    """Put distinct keys, none of them in ``table``, into free slots (the table has room)."""
    index = _slots(table, keys)
    active = np.arange(keys.size)
    while active.size:
        free = active[table[index[active]] == 0]
        table[index[free]] = keys[free]  # of keys racing for one slot the last wins; the others probe on
        placed = table[index[active]] == keys[active]
        active = active[~placed]
        index[active] = (index[active] + 1) & (table.size - 1)
