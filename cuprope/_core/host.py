"""The NumPy backend's plumbing: host arrays (NumPy, CPU torch, JAX on the
CPU) in and out of the float64 reference.

Every front end computes its float64 result with ``cuprope.reference`` (or
its own op's reference), rounds it once to the dtype, and hands the
results to :func:`finish`, which writes them into the outputs or returns new
arrays in the caller's framework.
"""
from __future__ import annotations

import numpy as np

from .. import reference
from .arrays import wrap_like
from .layout import from_canon, to_canon


def to_numpy(info):
    """A NumPy view of a host array (bfloat16 as ``ml_dtypes.bfloat16``)."""
    a = info.array
    if info.kind == "torch":
        if info.dtype == "bfloat16":
            import ml_dtypes
            import torch
            return a.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return a.numpy()
    return np.asarray(a)


def from_numpy(info, arr):
    """``arr`` as the framework of ``info``'s array."""
    if info.kind == "torch":
        import torch
        if info.dtype == "bfloat16":
            return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(arr)
    return wrap_like(info, arr)


def canon64(info, layout):
    """A host array as float64 ``[B, S, H, D]``."""
    return to_canon(to_numpy(info), layout).astype(np.float64)


def finish(infos, out_infos, results, layout):
    """Round each canonical float64 result to its input's dtype and return it:
    written into the outputs (all computed before any is written, so an
    output may be an input) or as new arrays of the caller's type."""
    results = [reference.round_to_dtype(from_canon(y, layout), to_numpy(i).dtype)
               for i, y in zip(infos, results)]
    if out_infos is None:
        return tuple(from_numpy(info, y) for info, y in zip(infos, results))
    for o, y in zip(out_infos, results):
        to_numpy(o)[...] = y
    return tuple(o.obj for o in out_infos)
