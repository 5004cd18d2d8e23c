"""Public array API: forward and backward RoPE for one tensor or for q and k.

Every function takes NumPy, CuPy, PyTorch or JAX arrays (or any DLPack /
CUDA-array-interface producer) and returns the caller's type. GPU arrays run
the CUDA kernels on the array's own device and on the caller's current stream
(torch's for torch tensors, CuPy's otherwise; ``stream=`` overrides). Host
arrays run the float64 NumPy reference and are cast back to their dtype.

Shapes, by ``config.layout``:
  * ``"bshd"``: x ``[B, S, H, D]``; positions ``[S]`` or ``[B, S]``
  * ``"bhsd"``: x ``[B, H, S, D]``; positions ``[S]`` or ``[B, S]``
  * ``"thd"``:  x ``[T, H, D]`` (packed tokens); positions ``[T]``, required
    (or ``seq_offsets`` ``[1]`` for one sequence): a ValueError without both
With a multi-stream config (``stream_map``), positions gain a leading stream
axis ``[n_streams, ...]``. Positions are int32 or int64; without them token s
of a sequence sits at ``offset + seq_offsets[b] + s``; with them at
``offset + seq_offsets[b] + positions[..]``, exact for |position| <=
2**31 - 1 (an offset, or host positions, outside raise ValueError; GPU
positions are not read back to check). dtypes: float32, float16,
bfloat16 (math in fp32, angles in float64). Any stride for batch, sequence and
head dims; the last dim must be contiguous.

PyTorch (``cuprope._core.torch_guard``): with grad mode on, tensors that require
grad go through the differentiable adapter (``rope_forward`` /
``rope_backward`` -> ``cuprope.torch.rope``, ``rope_qk_forward`` /
``rope_qk_backward`` -> ``cuprope.torch.rope_qk``; the backward functions
rotate by the transpose, and their own gradient is the forward rotation), so
the result requires grad. ``inplace=True`` then writes the differentiable
result back (``x.copy_``), except into a leaf that requires grad (or a view
of one): RuntimeError, as torch's in-place ops. ``out=`` or ``stream=`` with
a tensor that requires grad is a TypeError naming the adapter (torch's out=
ops are not differentiable either). Under ``torch.compile`` every call
becomes the custom op ``cuprope::rope`` / ``cuprope::rope_qk``
(``fullgraph=True`` traces through; ``stream=`` is a graph break).
Under ``torch.no_grad()`` / ``inference_mode`` nothing changes.

``enable_pdl=True`` (``rope_forward``, ``rope_qk_forward``; CUDA, compute
capability 9.0 or newer) makes the launch a programmatic dependent launch,
as serving engines launch their decode kernels under CUDA graphs: the kernel
may start while the stream's previous kernel (say the GEMM that writes q and
k) is still running; it reads positions and seq_offsets (and cuprope's own
frequency and angle tables) first, then waits for that kernel before its
first load of x / q / k and its first store. So positions and seq_offsets
must be complete when the previous kernel starts (written by an earlier
kernel, a copy or the host); the inputs may be written by the previous
kernel itself. Off by default: cuprope cannot know who wrote the positions,
so no automatic rule is safe. Results are the same bits. A GPU before sm_90
is a ValueError, a driver without ``cuLaunchKernelEx`` (before CUDA 12) a
RuntimeError; no effect on the NumPy backend; not under ``cuprope.jax``
(jaxlib's kernel call takes no launch attributes).
"""
from __future__ import annotations

from .._core.engine import rope_call
from .._core.torch_guard import engaged
from .._core.validate import pair
from ..config import RopeConfig

__all__ = ["rope_forward", "rope_backward", "rope_qk_forward", "rope_qk_backward"]


def rope_forward(x, config: RopeConfig, *, positions=None, offset: int = 0, seq_offsets=None,
                 out=None, inplace: bool = False, stream=None, enable_pdl: bool = False):
    """Rotate ``x`` by its positions. Returns the rotated array (``x`` itself
    when ``inplace``; ``out`` when given). See the module docstring for shapes
    and ``enable_pdl``. Torch tensors that require grad: ``cuprope.torch.rope``
    (differentiable)."""
    outs = None if out is None else (out,)
    if engaged(x, None, out):
        return _torch("rope_forward", (x,), ("x",), config, False, positions, offset,
                      seq_offsets, outs, inplace, stream, enable_pdl)[0]
    return rope_call((x,), ("x",), config, False, positions, offset, seq_offsets, outs,
                     inplace, stream, enable_pdl)[0]


def rope_backward(grad_out, config: RopeConfig, *, positions=None, offset: int = 0,
                  seq_offsets=None, out=None, inplace: bool = False, stream=None):
    """Gradient of ``rope_forward`` w.r.t. its input: the transposed rotation
    (sin → −sin) with the same positions, table and scale. Torch tensors that
    require grad: ``cuprope.torch.rope``'s inverse (differentiable)."""
    outs = None if out is None else (out,)
    if engaged(grad_out, None, out):
        return _torch("rope_backward", (grad_out,), ("grad_out",), config, True, positions,
                      offset, seq_offsets, outs, inplace, stream)[0]
    return rope_call((grad_out,), ("grad_out",), config, True, positions, offset, seq_offsets,
                     outs, inplace, stream)[0]


def rope_qk_forward(q, k, config: RopeConfig, *, positions=None, offset: int = 0,
                    seq_offsets=None, out=None, inplace: bool = False, stream=None,
                    enable_pdl: bool = False):
    """Rotate q and k in one launch; cos/sin are computed once per (token, pair)
    and shared by every head of both. q and k share B, S (or T), D and dtype;
    their head counts may differ (GQA/MQA). ``out``: a (q_out, k_out) pair.
    ``enable_pdl``: a programmatic dependent launch (module docstring).
    Returns (q_rotated, k_rotated). Torch tensors that require grad:
    ``cuprope.torch.rope_qk`` (differentiable)."""
    if engaged(q, k, out):
        return _torch("rope_qk_forward", (q, k), ("q", "k"), config, False, positions, offset,
                      seq_offsets, pair(out), inplace, stream, enable_pdl)
    return rope_call((q, k), ("q", "k"), config, False, positions, offset, seq_offsets,
                     pair(out), inplace, stream, enable_pdl)


def rope_qk_backward(grad_q, grad_k, config: RopeConfig, *, positions=None, offset: int = 0,
                     seq_offsets=None, out=None, inplace: bool = False, stream=None):
    """Gradients of ``rope_qk_forward`` w.r.t. q and k, in one launch. Torch
    tensors that require grad: ``cuprope.torch.rope_qk``'s inverse
    (differentiable)."""
    if engaged(grad_q, grad_k, out):
        return _torch("rope_qk_backward", (grad_q, grad_k), ("grad_q", "grad_k"), config, True,
                      positions, offset, seq_offsets, pair(out), inplace, stream)
    return rope_call((grad_q, grad_k), ("grad_q", "grad_k"), config, True, positions, offset,
                     seq_offsets, pair(out), inplace, stream)


def _torch(name, xs, names, config, inverse, positions, offset, seq_offsets, outs, inplace,
           stream, enable_pdl=False):
    """A call on torch tensors that torch_guard.engaged sent to the route of
    ``cuprope.rope.torch`` (imported only then)."""
    from .torch import route_rope

    def core():
        return rope_call(xs, names, config, inverse, positions, offset, seq_offsets, outs,
                         inplace, stream, enable_pdl)
    return route_rope(name, xs, config, inverse, positions, offset, seq_offsets, outs, inplace,
                      stream, core, enable_pdl)
