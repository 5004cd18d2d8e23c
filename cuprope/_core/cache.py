"""A bounded, thread-safe LRU of RopeConfigs that front ends build on the
fly (one per frequency table or parameter set they are called with).

A config leaving the cache may still have its device tables read by kernels
queued on some stream: eviction waits for those devices before the tables'
memory can be reused.
"""
from __future__ import annotations

import threading
from collections import OrderedDict


class ConfigCache:
    def __init__(self, size: int = 64):
        self._size = size
        self._lock = threading.Lock()
        self._items: OrderedDict = OrderedDict()

    def get(self, key, build):
        """The config under ``key``, made by ``build()`` on a miss."""
        with self._lock:
            cfg = self._items.get(key)
            if cfg is not None:
                self._items.move_to_end(key)
                return cfg
        cfg = build()
        with self._lock:
            cfg = self._items.setdefault(key, cfg)  # a racing thread's build wins
            while len(self._items) > self._size:
                _, old = self._items.popitem(last=False)
                _retire(old)
        return cfg

    def clear(self):
        with self._lock:
            while self._items:
                _retire(self._items.popitem()[1])

    def __len__(self):
        return len(self._items)


def _retire(cfg):
    """Wait for every device holding ``cfg``'s tables."""
    if not cfg._device_tables:
        return
    import cupy
    for dev in cfg._device_tables:
        with cupy.cuda.Device(dev):
            cupy.cuda.runtime.deviceSynchronize()
