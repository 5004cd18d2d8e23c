"""Position tensors for packed (varlen) batches and for context parallelism,
exported as ``cuprope.positions``: each helper returns an int tensor in the
framework and on the device of its ``cu_seqlens`` / ``like`` argument (a
torch tensor, CuPy or NumPy array), built there without a host round trip
when the sizes are given, ready to pass as ``positions=``.
"""
from __future__ import annotations

import numpy as np

__all__ = ["packed_positions", "context_parallel_positions"]


def _xp(like):
    mod = type(like).__module__ if like is not None else "numpy"
    if mod.startswith("torch"):
        import torch
        return "torch", torch
    if mod.startswith("cupy"):
        import cupy
        return "cupy", cupy
    return "numpy", np


def packed_positions(cu_seqlens, total_tokens: int | None = None, *, offset: int = 0,
                     dtype: str = "int32"):
    """Positions ``[T]`` for tokens packed back to back: token t of sequence i
    (``cu_seqlens[i] <= t < cu_seqlens[i+1]``) sits at ``offset + t - cu_seqlens[i]``.

    Parameters
    ----------
    cu_seqlens : int array ``[n_seq + 1]``
        Starting at 0, non-decreasing (torch, CuPy or NumPy; the result lives
        beside it).
    total_tokens : int, optional
        T; give it to avoid a device-to-host read of ``cu_seqlens[-1]``
        (CUDA-graph safe).
    offset : int
        Added to every position.
    dtype : str
        The result's integer dtype, ``"int32"`` or ``"int64"``.

    Returns
    -------
    array ``[T]``
        ``dtype``, in ``cu_seqlens``' framework and on its device.
    """
    kind, xp = _xp(cu_seqlens)
    if len(cu_seqlens.shape) != 1 or cu_seqlens.shape[0] < 1:
        raise ValueError(f"cu_seqlens must be 1-D [n_seq + 1], got shape {tuple(cu_seqlens.shape)}")
    if total_tokens is None:
        total_tokens = int(cu_seqlens[-1])
    if kind == "torch":
        dt = getattr(xp, dtype)
        t = xp.arange(total_tokens, device=cu_seqlens.device, dtype=xp.int64)
        seq = xp.searchsorted(cu_seqlens.to(xp.int64), t, right=True) - 1
        return (t - cu_seqlens.to(xp.int64)[seq] + offset).to(dt)
    t = xp.arange(total_tokens, dtype=np.int64)
    cs = cu_seqlens.astype(np.int64)
    seq = xp.searchsorted(cs, t, side="right") - 1
    return (t - cs[seq] + offset).astype(dtype)


def context_parallel_positions(local_len: int, cp_size: int, cp_rank: int, *, offset: int = 0,
                               like=None, dtype: str = "int32"):
    """Global positions ``[local_len]`` of the tokens a context-parallel rank holds
    in the load-balanced layout: the sequence is cut into 2·cp_size chunks of
    c = local_len / 2 tokens and rank r holds chunks r and 2·cp_size − 1 − r,
    so its first half sits at ``s + r·c`` and its second half at
    ``(s − c) + (2·cp_size − 1 − r)·c`` (TransformerEngine's convention).

    Parameters
    ----------
    local_len : int
        The rank's token count, even (two chunks per rank).
    cp_size, cp_rank : int
        The context-parallel group's size and this rank, ``0 <= cp_rank <
        cp_size``.
    offset : int
        Added to every position.
    like : array, optional
        A torch tensor, CuPy or NumPy array whose framework and device the
        result takes (default: NumPy).
    dtype : str
        ``"int32"`` or ``"int64"``.

    Returns
    -------
    array ``[local_len]``
        ``dtype``, beside ``like``.
    """
    if local_len % 2:
        raise ValueError(f"local_len must be even (two chunks per rank), got {local_len}")
    if not 0 <= cp_rank < cp_size:
        raise ValueError(f"cp_rank must be in [0, {cp_size}), got {cp_rank}")
    kind, xp = _xp(like)
    c = local_len // 2
    if kind == "torch":
        s = xp.arange(local_len, device=like.device, dtype=xp.int64)
        second = (s >= c).to(xp.int64)
    else:
        s = xp.arange(local_len, dtype=np.int64)
        second = (s >= c).astype(np.int64)
    chunk = cp_rank + second * (2 * cp_size - 1 - 2 * cp_rank)
    pos = s - second * c + chunk * c + offset
    return pos.to(getattr(xp, dtype)) if kind == "torch" else pos.astype(dtype)
