"""The rotation's engine under its public API: a validated call runs on the
NumPy backend (host arrays) or becomes a launch plan on the GPU.
:func:`rope_call` is the core entry (``cuprope.rope.api`` calls it);
:func:`run_plan` launches a plan of the rope kernel family for the table
calls too. Plans are cached on their owner (``RopeConfig._launches``, or a
table source's) by call signature; a repeated call takes the fast path
(``fast``) instead.
"""
from __future__ import annotations

import threading

import numpy as np

from .. import reference
from ..config import RopeConfig
from .._core import host, launcher, validate
from .._core.arrays import describe
from .._core.engine import empty_result, hand_back, outputs, stream_handle, tensor_plans
from .._core.launch import sm_count
from .._core.launcher import on_device
from .._core.layout import to_canon
from .._core.validate import check_positions
from . import decode, fast
from .launch import rope_spec


def rope_call(xs, names, config, inverse, positions, offset, seq_offsets, outs, inplace, stream,
              enable_pdl=False):
    """Rotate ``xs`` (x, or q and k) by ``config``: the whole of
    ``cuprope.rope_forward`` and friends. Returns a tuple like ``xs``.
    ``enable_pdl``: a programmatic dependent launch (no effect on the host)."""
    if not isinstance(config, RopeConfig):
        raise TypeError(f"config must be a cuprope.RopeConfig, got {type(config).__name__}")
    res = fast.fast_path(xs, config, inverse, positions, offset, seq_offsets, outs, inplace,
                         stream, enable_pdl)
    if res is not None:
        return res
    enable_pdl = validate.check_flag(enable_pdl, "enable_pdl")
    offset = validate.as_offset(offset)
    head_rows = config.inv_freq.shape[0] if config.per_head else None
    infos, out_infos, (b, s, d) = validate.validate_call(xs, names, config.layout,
                                                         config.rotary_dim, outs, inplace,
                                                         head_rows)
    pos_info, seq_info = index_infos(config, infos[0].device, b, s, positions, seq_offsets,
                                     infos[0].shape)
    if all(i.size == 0 for i in infos):
        return empty_result(infos, out_infos)
    if infos[0].device < 0:
        return host_rope(infos, out_infos, config, inverse, pos_info, seq_info, offset)
    cache_key = fast.fast_key(infos[0].kind, xs, config, inverse, positions, seq_offsets,
                              outs, inplace, stream, enable_pdl)
    return _gpu_rope(infos, out_infos, config, inverse, pos_info, seq_info, offset, stream,
                     (b, s, d), cache_key, enable_pdl)


def index_infos(config, device, b, s, positions, seq_offsets, shape=None):
    """(positions, seq_offsets) infos (None where not given), checked
    against ``config`` and the tensors' device and (B, S), ``shape`` the
    first tensor's (validate.check_indices)."""
    pos_info = None if positions is None else describe(positions, "positions")
    seq_info = None if seq_offsets is None else describe(seq_offsets, "seq_offsets")
    validate.check_indices(config, device, b, s, pos_info, seq_info, shape)
    return pos_info, seq_info


def position_fields(config, pos_info):
    """The positions tensor as the kernels read it: None (implicit positions)
    or (is64, stream stride, batch stride, sequence stride) in elements, a
    ``[S]`` / ``[T]`` tensor with batch stride 0 and, for one stream, stream
    stride 0."""
    if pos_info is None:
        return None
    st, shp = pos_info.strides, pos_info.shape
    if config.n_streams == 1:
        pst_stream, rest, rest_shape = 0, st, shp
    else:
        pst_stream, rest, rest_shape = st[0], st[1:], shp[1:]
    psb, pss = (0, rest[0]) if len(rest_shape) == 1 else rest
    return (int(pos_info.dtype == "int64"), pst_stream, psb, pss)


def _gpu_rope(infos, out_infos, config, inverse, pos_info, seq_info, offset, stream, bsd,
              cache_key, pdl=False):
    b, s, d = bsd
    device = infos[0].device
    stream_ptr = stream_handle(stream, infos[0])
    copy_rest, out_infos = outputs(infos, out_infos)
    # Only what the plan key needs is computed before the lookup.
    pos = position_fields(config, pos_info)
    seq64 = None if seq_info is None else seq_info.dtype == "int64"
    # Plans are reused for calls with the same signature (any framework).
    gkey = ("G", threading.get_ident(), inverse, copy_rest, device, pos, seq64, pdl,
            tuple((i.dtype, tuple(i.shape), i.strides, i.ptr % 16) for i in infos),
            tuple((o.strides, o.ptr % 16) for o in out_infos))
    plan = config._launches.plans.get(gkey)
    if plan is None:
        inv_freq, smap = config.device_tables(device)
        angles = decode.AngleSource(config, device, stream_ptr)
        plan = launcher.plan(rope_spec(
            sms=sm_count(device), dtype=infos[0].dtype, interleaved=config.interleaved,
            plans=tensor_plans(infos, out_infos, config.layout),
            n_batch=b, n_seq=s, head_dim=d, rot_dim=config.rotary_dim, copy_rest=copy_rest,
            pos=pos, seq_off=seq64, inv_freq_ptr=inv_freq.data.ptr,
            freq_sh=config.rotary_dim // 2 if config.per_head else 0,
            stream_map_ptr=0 if smap is None else smap.data.ptr, scale=config.scale,
            sin_sign=-1.0 if inverse else 1.0, angles=angles, pdl=pdl), device)
        if angles.settled:
            config._launches.plans[gkey] = plan
        else:  # launched once without the table it wants (under capture): not kept
            cache_key = None
    return run_plan(plan, config, infos, out_infos, stream_ptr,
                    0 if pos_info is None else pos_info.ptr,
                    0 if seq_info is None else seq_info.ptr, offset, cache_key)


def run_plan(plan, owner, infos, out_infos, stream_ptr, idx1, idx2, offset, cache_key):
    """Launch a rope ``plan`` (launcher.Plan taking launch.ROPE_CALLS' values)
    on the tensors' device, register it on ``owner``'s fast-path cache under
    ``cache_key`` (a fastpath ticket) and hand the outputs back in the
    caller's framework. idx1, idx2: the positions and sequence-offset
    pointers (cos and sin for the table source)."""
    on_device(infos[0].device, plan.run, stream_ptr, infos[0].ptr, infos[-1].ptr,
              out_infos[0].ptr, out_infos[-1].ptr, idx1, idx2, offset)
    fast.remember_rope(owner, cache_key, plan, infos, out_infos)
    return hand_back(infos, out_infos, stream_ptr)


def host_rope(infos, out_infos, config, inverse, pos_info, seq_info, offset):
    """Core RoPE on host arrays: the float64 reference, rounded once."""
    layout = config.layout
    x0 = to_canon(host.to_numpy(infos[0]), layout)
    given = {"positions": pos_info, "seq_offsets": seq_info}
    given = {k: host.to_numpy(v) for k, v in given.items() if v is not None}
    for name, idx in given.items():  # each within range first: their sum cannot wrap
        check_positions(idx.astype(np.int64), name)
    pos = reference.token_positions(x0.shape[0], x0.shape[1], offset=offset,
                                    n_streams=config.n_streams, **given)
    check_positions(pos)
    angles = reference.pair_angles(pos, config.inv_freq, config.stream_map)
    results = [reference.rotate(host.canon64(info, layout), angles, rotary_dim=config.rotary_dim,
                                interleaved=config.interleaved, scale=config.scale,
                                inverse=inverse)
               for info in infos]
    return host.finish(infos, out_infos, results, layout)
