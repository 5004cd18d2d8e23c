"""The pieces every op's launch shares between validation and its plan:
the outputs (allocated like the inputs where not given), the stream to
launch on, canonical tensor plans, the result handed back in the caller's
framework, and the empty call's result.
"""
from __future__ import annotations

import numpy as np

from . import validate
from .arrays import describe, empty_like, wrap_like
from .launch import TensorPlan
from .layout import canon_sizes, canon_strides

def empty_result(infos, out_infos):
    """The result of a call on empty tensors: nothing to launch."""
    res = [o.obj for o in out_infos] if out_infos else [wrap_like(i, empty_like(i)) for i in infos]
    return tuple(res)


def stream_handle(stream, info):
    """The raw ``cudaStream_t`` to launch on: ``stream=`` (a torch/CuPy stream,
    anything with ``__cuda_stream__``, or an int), else the caller's current
    stream (torch's for torch tensors, CuPy's otherwise)."""
    if stream is not None:
        if isinstance(stream, (int, np.integer)):
            return int(stream)
        if hasattr(stream, "cuda_stream"):
            return int(stream.cuda_stream)
        if hasattr(stream, "__cuda_stream__"):
            return int(stream.__cuda_stream__()[1])
        if hasattr(stream, "ptr"):
            return int(stream.ptr)
        raise TypeError(f"stream must be a stream object or a raw cudaStream_t int, "
                        f"got {type(stream).__name__}")
    if info.kind == "torch":
        import torch
        return torch.cuda.current_stream(info.device).cuda_stream
    import cupy
    with cupy.cuda.Device(info.device):
        return cupy.cuda.get_current_stream().ptr


def outputs(infos, out_infos):
    """(copy_rest, out_infos): whether dims >= R must be copied
    (out-of-place), and the outputs (allocated like the inputs when not
    given)."""
    copy_rest = out_infos is None or not all(validate.same_view(o, i)
                                             for o, i in zip(out_infos, infos))
    if out_infos is None:
        out_infos = [describe(empty_like(i), "out") for i in infos]
    return copy_rest, out_infos


def tensor_plans(infos, out_infos, layout):
    """A TensorPlan (canonical strides, head count) per rotated tensor."""
    return [TensorPlan(i.ptr, o.ptr, canon_strides(i.strides, layout),
                       canon_strides(o.strides, layout), canon_sizes(i.shape, layout)[2])
            for i, o in zip(infos, out_infos)]


def hand_back(infos, out_infos, stream_ptr):
    """The outputs in the callers' framework. JAX reads the result on its own
    stream: make it complete first."""
    if infos[0].kind == "jax":
        import cupy
        cupy.cuda.runtime.streamSynchronize(stream_ptr)
    return tuple(wrap_like(i, o.obj) for i, o in zip(infos, out_infos))
