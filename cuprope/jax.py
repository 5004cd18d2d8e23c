"""JAX adapter: cuprope inside ``jax.jit`` with ``jax.grad``.

``rope_qk(q, k, config, positions=None, offset=0)`` and ``rope(x, config, ...)``
run through ``jax.experimental.buffer_callback``: XLA hands over its own
input buffers and freshly allocated output buffers, and the kernel runs on
XLA's stream (``ctx.stream``) writing only the outputs — never a buffer JAX
owns as an input. ``jax.custom_vjp`` attaches cuprope's backward (the
transposed rotation). ``config`` and ``offset`` are static (a new ``offset``
value retraces); pass ``positions`` for positions that change per step.

On the CPU backend the same callbacks run the NumPy backend, so everything
here also works (slowly) without a GPU.
"""
from __future__ import annotations

from functools import partial

import jax
import numpy as np
from jax.experimental import buffer_callback

from . import api
from .config import RopeConfig, config_by_key

__all__ = ["rope_qk", "rope"]


_DL_CPU = 1  # DLPack device type of host memory


def _on_gpu(buf) -> bool:
    return buf.__dlpack_device__()[0] != _DL_CPU


def _host_or_device(buf):
    """A NumPy (CPU) or CuPy (GPU) view of an XLA buffer."""
    if _on_gpu(buf):
        import cupy
        return cupy.asarray(buf)
    return np.asarray(buf)


def _stream(ctx, buf):
    """XLA's stream on GPU (ctx.stream raises on the CPU backend)."""
    return ctx.stream if _on_gpu(buf) else None


def _qk_callback(ctx, out, q, k, *pos, key, offset, inverse):
    fn = api.rope_qk_backward if inverse else api.rope_qk_forward
    stream = _stream(ctx, q)
    fn(_host_or_device(q), _host_or_device(k), config_by_key(key),
       positions=_host_or_device(pos[0]) if pos else None, offset=offset,
       out=(_host_or_device(out[0]), _host_or_device(out[1])), stream=stream)


def _x_callback(ctx, out, x, *pos, key, offset, inverse):
    fn = api.rope_backward if inverse else api.rope_forward
    stream = _stream(ctx, x)
    fn(_host_or_device(x), config_by_key(key),
       positions=_host_or_device(pos[0]) if pos else None, offset=offset,
       out=_host_or_device(out), stream=stream)


def _qk_call(q, k, positions, key, offset, inverse):
    types = (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, k.dtype))
    cb = buffer_callback.buffer_callback(
        partial(_qk_callback, key=key, offset=offset, inverse=inverse), types)
    args = (q, k) if positions is None else (q, k, positions)
    return cb(*args)


def _x_call(x, positions, key, offset, inverse):
    cb = buffer_callback.buffer_callback(
        partial(_x_callback, key=key, offset=offset, inverse=inverse),
        jax.ShapeDtypeStruct(x.shape, x.dtype))
    return cb(x) if positions is None else cb(x, positions)


@partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _rope_qk(q, k, positions, key, offset):
    return _qk_call(q, k, positions, key, offset, False)


def _rope_qk_fwd(q, k, positions, key, offset):
    return _qk_call(q, k, positions, key, offset, False), positions


def _rope_qk_bwd(key, offset, positions, g):
    dq, dk = _qk_call(g[0], g[1], positions, key, offset, True)
    return dq, dk, None


_rope_qk.defvjp(_rope_qk_fwd, _rope_qk_bwd)


@partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _rope(x, positions, key, offset):
    return _x_call(x, positions, key, offset, False)


def _rope_fwd(x, positions, key, offset):
    return _x_call(x, positions, key, offset, False), positions


def _rope_bwd(key, offset, positions, g):
    return _x_call(g, positions, key, offset, True), None


_rope.defvjp(_rope_fwd, _rope_bwd)


def _check(config, offset):
    if not isinstance(config, RopeConfig):
        raise TypeError(f"config must be a cuprope.RopeConfig, got {type(config).__name__}")
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
        raise TypeError("offset must be a Python int under jax (static); pass positions= for "
                        "positions that change from call to call")
    return config.key, int(offset)


def rope_qk(q, k, config: RopeConfig, *, positions=None, offset: int = 0):
    """Differentiable, jit-able fused q/k RoPE on JAX arrays (shapes as
    ``cuprope.rope_qk_forward``). Returns (q_rot, k_rot)."""
    key, offset = _check(config, offset)
    return _rope_qk(q, k, positions, key, offset)


def rope(x, config: RopeConfig, *, positions=None, offset: int = 0):
    """Differentiable, jit-able single-tensor RoPE on JAX arrays."""
    key, offset = _check(config, offset)
    return _rope(x, positions, key, offset)
