"""LRPE's JAX adapter: ``rotate_1d`` binds the rotation's primitive
(:mod:`cuprope.rope.jax`, kind "lrpe") and registers its NumPy backend for
the CPU lowering; re-exported by :mod:`cuprope.jax`.
"""
from __future__ import annotations

import jax
import numpy as np

from . import api
from .._core.jax_common import static_offset
from ..rope import jax as rope_jax
from ..rope.xla import theta_table

__all__ = ["rotate_1d"]


def _host_call(call, xs, rest):
    """rotate-1d on NumPy arrays (the primitive's CPU lowering)."""
    if call.inverse:
        return api.rotate_1d_backward(rest[0] if call.has_x else None, xs[0], theta_table(call),
                                      offset=call.offset, act=call.act, dim=call.dim)
    return api.rotate_1d_forward(xs[0], theta_table(call), offset=call.offset, act=call.act,
                                 dim=call.dim)


rope_jax.HOST_CALLS["lrpe"] = _host_call


def rotate_1d(x, theta, *, offset: int = 0, act: str = "none", dim=None):
    """LRPE rotate-1d: ``rotate(act(x, dim))``, as
    :func:`cuprope.lrpe.rotate_1d_forward`.

    Parameters
    ----------
    x : jax.Array
        ``[B, N, H, D]`` or ``[B, N, D]``; float32, float16 or bfloat16.
    theta : array-like
        Concrete (a NumPy array or list; a tracer is a TypeError): its
        table is fixed when the call is traced. Shapes as
        :func:`cuprope.lrpe.normalize_theta` takes them. Static.
    offset : int
        Static.
    act : str
        One of ``cuprope.api.ACTS``. Static.
    dim : {None, -1, 1}
        The softmax's axis: the head dim (-1) or the sequence (1). Static.
        Softmax over the sequence lowers to two kernel calls on a GPU: its
        statistics pass, then the rotation.

    Returns
    -------
    jax.Array
        x's shape and dtype. Gradients, vmap, sharding and lowering as
        :func:`rope`.
    """
    if isinstance(theta, jax.core.Tracer):
        raise TypeError("theta must be concrete under jax (a NumPy array or list): its table "
                        "is fixed when the call is traced")
    if x.ndim not in (3, 4):
        raise ValueError(f"x must be [B, N, H, D] or [B, N, D], got shape {tuple(x.shape)}")
    heads = x.shape[2] if x.ndim == 4 else 1
    theta2 = api.normalize_theta(np.asarray(theta), heads, x.shape[-1])
    if act not in api.ACTS:
        raise ValueError(f"act must be one of {api.ACTS}, got {act!r}")
    if dim not in (None, -1, 1):
        raise ValueError(f"dim must be None, -1 (the head dim) or 1 (the sequence dim), "
                         f"got {dim!r}")
    call = rope_jax.Call("lrpe", 1, layout="bshd" if x.ndim == 4 else "bsd",
                         offset=static_offset(offset), theta=(theta2.shape[0], theta2.tobytes()),
                         act=act, dim=None if dim is None else int(dim))
    return rope_jax.apply(call, (x,), ())[0]
