"""Counting host synchronisations of a piece of decoding code (a contributor's tool, used by tests/benchmarks).

On a GPU every read of a tensor's value by Python (`bool(t)`, `t.item()`, `t.tolist()`, `int(t)`, `float(t)`,
`t.nonzero()`, a tensor used as a Python index, boolean-mask indexing) waits for the device to finish the queued
work. `count_host_syncs()` counts those calls (on any device: on the CPU they cost little, but the count is what
a GPU would wait for) while its block runs, by wrapping the `torch.Tensor` methods that do them.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator

import torch

_READS = ("__bool__", "item", "tolist", "__int__", "__float__", "nonzero", "__index__")


@contextlib.contextmanager
def count_host_syncs() -> Iterator[Counter]:
    """`with count_host_syncs() as counts: ...` -> counts[name] = calls of each value-reading method
    (plus "masked_index" for `t[bool_tensor]`). Not thread-safe: it patches `torch.Tensor` while it runs."""
    counts: Counter = Counter()
    originals = {name: getattr(torch.Tensor, name) for name in (*_READS, "__getitem__")}

    def counting(name, method):
        def wrapper(self, *args, **kwargs):
            counts[name] += 1
            return method(self, *args, **kwargs)

        return wrapper

    def getitem(self, index):
        items = index if isinstance(index, tuple) else (index,)
        if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items):
            counts["masked_index"] += 1
        return originals["__getitem__"](self, index)

    for name in _READS:
        setattr(torch.Tensor, name, counting(name, originals[name]))
    torch.Tensor.__getitem__ = getitem
    try:
        yield counts
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)
