"""The core op: RoPE by a :class:`~cuprope.RopeConfig`, forward and backward,
for one tensor or for q and k in one launch (exported by :mod:`cuprope`).

Any framework's arrays in, the caller's type out: GPU arrays run the CUDA
kernels, host arrays the float64 NumPy reference. Shapes, dtypes, positions
and the PyTorch rules are in :func:`rope_forward`'s docstring.
"""
from __future__ import annotations

from .engine import rope_call
from .._core.torch_guard import engaged
from .._core.validate import pair
from ..config import RopeConfig

__all__ = ["rope_forward", "rope_backward", "rope_qk_forward", "rope_qk_backward"]


def rope_forward(x, config: RopeConfig, *, positions=None, offset: int = 0, seq_offsets=None,
                 out=None, inplace: bool = False, stream=None, enable_pdl: bool = False):
    """Rotate ``x`` by its positions.

    The first R = ``config.rotary_dim`` dims of every head turn pair by pair
    (pairing: ``config.interleaved``), pair j of a token at position p by the
    angle p·θ_j, with cos and sin times ``config.scale``; dims ``[R, D)`` pass
    through. Angles are formed in float64, the rotation in fp32.

    Parameters
    ----------
    x : array
        NumPy, CuPy, PyTorch or JAX array, or any DLPack /
        CUDA-array-interface producer; float32, float16 or bfloat16. Shape
        by ``config.layout``: ``"bshd"`` ``[B, S, H, D]``, ``"bhsd"``
        ``[B, H, S, D]``, ``"thd"`` ``[T, H, D]`` (packed tokens). Any stride
        for the batch, sequence and head dims; the last dim contiguous.
    config : RopeConfig
        Frequencies (shared ``[R/2]`` or per head ``[H, R/2]``), pairing,
        layout, scale and stream map.
    positions : int32 or int64 array, optional
        ``[S]`` or ``[B, S]`` (``"bshd"``, ``"bhsd"``), ``[T]`` (``"thd"``);
        with a stream map (``config.stream_map``) a leading stream axis
        ``[n_streams, ...]``. On x's device. Required for ``"thd"`` unless
        ``seq_offsets`` ``[1]`` gives one sequence (ValueError without
        both).
    offset : int
        Added to every position.
    seq_offsets : int32 or int64 array ``[B]``, optional
        Added to every position of sequence b; contiguous.
    out : array, optional
        The output: x's shape and dtype, any strides with a contiguous last
        dim; it may be ``x`` itself, but may not otherwise overlap it.
    inplace : bool
        Write the result into ``x``. ``out`` and ``inplace`` are not for JAX
        arrays (immutable: TypeError).
    stream : optional
        The CUDA stream to launch on. Default: the caller's current stream
        (torch's for torch tensors, CuPy's otherwise).
    enable_pdl : bool
        Make the launch a programmatic dependent launch (CUDA, compute
        capability 9.0 or newer; see Notes). Off by default.

    Returns
    -------
    array
        The rotated array, of the caller's type: ``x`` itself when
        ``inplace``, ``out`` when given, else a new array.

    Raises
    ------
    TypeError
        A dtype other than float32, float16 or bfloat16; ``out=`` or
        ``stream=`` with a torch tensor that requires grad.
    ValueError
        Shapes that do not fit the layout; positions, with ``offset`` and
        ``seq_offsets``, beyond |position| <= 2**31 - 1 (an offset, or host
        positions; GPU positions are not read back to check);
        ``enable_pdl`` on a GPU before sm_90.
    RuntimeError
        ``enable_pdl`` with a driver without ``cuLaunchKernelEx`` (before
        CUDA 12); in place into a torch leaf that requires grad (or a view
        of one), as torch's in-place ops.

    Notes
    -----
    Token s of sequence b sits at ``offset + seq_offsets[b] + s`` without
    ``positions``, at ``offset + seq_offsets[b] + positions[..]`` with them.
    GPU arrays run on the array's own device; host arrays run the float64
    NumPy reference and are cast back to their dtype.

    PyTorch (``cuprope._core.torch_guard``): with grad mode on, tensors that
    require grad go through the differentiable adapter
    (``cuprope.torch.rope``; ``rope_qk_forward`` and ``rope_qk_backward``:
    ``cuprope.torch.rope_qk``), so the result requires grad; ``inplace=True``
    then writes the differentiable result back (``x.copy_``). torch's
    ``out=`` ops are not differentiable either, hence the TypeError. Under
    ``torch.compile`` every call becomes the custom op ``cuprope::rope`` /
    ``cuprope::rope_qk`` (``fullgraph=True`` traces through; ``stream=`` is
    a graph break). Under ``torch.no_grad()`` / ``inference_mode`` nothing
    changes.

    ``enable_pdl`` launches as serving engines launch their decode kernels
    under CUDA graphs: the kernel may start while the stream's previous
    kernel (say the GEMM that writes q and k) still runs; it reads positions
    and seq_offsets (and cuprope's own frequency and angle tables) first,
    then waits for that kernel before its first load of x / q / k and its
    first store. So positions and seq_offsets must be complete when the
    previous kernel starts (written by an earlier kernel, a copy or the
    host); the inputs may be written by the previous kernel itself. It is
    opt-in because cuprope cannot know who wrote the positions, so no
    automatic rule is safe. Results are the same bits. No effect on the
    NumPy backend; not under ``cuprope.jax`` (jaxlib's kernel call takes no
    launch attributes).
    """
    outs = None if out is None else (out,)
    if engaged(x, None, out):
        return _torch("rope_forward", (x,), ("x",), config, False, positions, offset,
                      seq_offsets, outs, inplace, stream, enable_pdl)[0]
    return rope_call((x,), ("x",), config, False, positions, offset, seq_offsets, outs,
                     inplace, stream, enable_pdl)[0]


def rope_backward(grad_out, config: RopeConfig, *, positions=None, offset: int = 0,
                  seq_offsets=None, out=None, inplace: bool = False, stream=None):
    """Gradient of :func:`rope_forward` w.r.t. its input: the transposed
    rotation (sin → −sin) with the same positions, table and scale.

    Parameters
    ----------
    grad_out : array
        The gradient of ``rope_forward``'s output: x's shape, layout and
        dtype (float32, float16 or bfloat16), the last dim contiguous.
    config, positions, offset, seq_offsets, out, inplace, stream
        As :func:`rope_forward` (the forward's values).

    Returns
    -------
    array
        The gradient w.r.t. x, of the caller's type (``grad_out`` itself
        when ``inplace``, ``out`` when given, else a new array).

    Notes
    -----
    Torch tensors that require grad (grad mode on) go through
    ``cuprope.torch.rope``'s inverse, which is differentiable again (its
    gradient is the forward rotation); under ``torch.compile``: the custom
    op ``cuprope::rope``. Raises as :func:`rope_forward`.
    """
    outs = None if out is None else (out,)
    if engaged(grad_out, None, out):
        return _torch("rope_backward", (grad_out,), ("grad_out",), config, True, positions,
                      offset, seq_offsets, outs, inplace, stream)[0]
    return rope_call((grad_out,), ("grad_out",), config, True, positions, offset, seq_offsets,
                     outs, inplace, stream)[0]


def rope_qk_forward(q, k, config: RopeConfig, *, positions=None, offset: int = 0,
                    seq_offsets=None, out=None, inplace: bool = False, stream=None,
                    enable_pdl: bool = False):
    """Rotate q and k in one launch: cos/sin are computed once per (token,
    pair) and shared by every head of both.

    Parameters
    ----------
    q, k : arrays
        Shapes by ``config.layout`` as x of :func:`rope_forward`, e.g.
        ``"bshd"``: q ``[B, S, Hq, D]``, k ``[B, S, Hk, D]``. They share B, S
        (or T), D and dtype (float32, float16 or bfloat16); their head
        counts may differ (GQA/MQA). Any batch, sequence and head strides;
        the last dim contiguous.
    config, positions, offset, seq_offsets, stream, enable_pdl
        As :func:`rope_forward`.
    out : pair of arrays, optional
        ``(q_out, k_out)``, q's and k's shapes and dtype.
    inplace : bool
        Write the results into q and k.

    Returns
    -------
    tuple
        ``(q_rotated, k_rotated)``, of the caller's type.

    Notes
    -----
    Torch tensors that require grad (grad mode on) go through
    ``cuprope.torch.rope_qk`` (differentiable); under ``torch.compile``: the
    custom op ``cuprope::rope_qk``. Raises, and the PDL rules, as
    :func:`rope_forward`.
    """
    if engaged(q, k, out):
        return _torch("rope_qk_forward", (q, k), ("q", "k"), config, False, positions, offset,
                      seq_offsets, pair(out), inplace, stream, enable_pdl)
    return rope_call((q, k), ("q", "k"), config, False, positions, offset, seq_offsets,
                     pair(out), inplace, stream, enable_pdl)


def rope_qk_backward(grad_q, grad_k, config: RopeConfig, *, positions=None, offset: int = 0,
                     seq_offsets=None, out=None, inplace: bool = False, stream=None):
    """Gradients of :func:`rope_qk_forward` w.r.t. q and k, in one launch (the
    transposed rotation, sin → −sin).

    Parameters
    ----------
    grad_q, grad_k : arrays
        The gradients of the forward's outputs: q's and k's shapes, layout
        and dtype.
    config, positions, offset, seq_offsets, out, inplace, stream
        As :func:`rope_qk_forward` (the forward's values).

    Returns
    -------
    tuple
        ``(dq, dk)``, of the caller's type.

    Notes
    -----
    Torch tensors that require grad go through ``cuprope.torch.rope_qk``'s
    inverse (differentiable; its gradient is the forward rotation).
    """
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
