"""The one validation layer every front end calls.

Each check raises ``TypeError`` (wrong kind or dtype) or ``ValueError`` (wrong
shape, device, range or overlap) naming the argument. Nothing here touches a
device: GPU arrays are checked by their metadata only.
"""
from __future__ import annotations

import numpy as np

from .arrays import FLOAT_DTYPES, INDEX_DTYPES, describe, overlaps
from .layout import DIMS, canon_sizes, ndim

MAX_TOKENS = 2 ** 31 - 1    # the kernels index tokens in 32 bits
MAX_POSITION = 2 ** 31 - 1  # angles are exact for |position| up to this


OTHER_LAYOUT = {"bshd": "bhsd", "bhsd": "bshd"}


def swapped_layout_hint(layout, shape, evidence, fits) -> str:
    """When ``fits`` (an argument matches the tensors' sequence and head axes
    swapped), a message tail naming ``layout=`` and the other 4-dim layout;
    ``evidence`` says what matched, with ``{seq}`` / ``{head}`` standing for
    the sequence / head axis numbers under ``layout``."""
    other = OTHER_LAYOUT.get(layout)
    if not fits or other is None:
        return ""
    seq, head = (1, 2) if layout == "bshd" else (2, 1)
    return (f"; layout={layout!r} reads {DIMS[layout]} (S = axis {seq}, H = axis {head}) but "
            f"{evidence.format(seq=seq, head=head)}: for {DIMS[other]} tensors use "
            f"RopeConfig(..., layout={other!r})")


def pair(out):
    """``out=`` of a q/k call as a tuple of two (None stays None)."""
    if out is None:
        return None
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError("out must be a (q_out, k_out) pair")
    return tuple(out)


def as_offset(offset) -> int:
    """``offset`` as an int with |offset| <= MAX_POSITION; bools and
    non-integers are a TypeError."""
    if isinstance(offset, (bool, np.bool_)) or not isinstance(offset, (int, np.integer)):
        raise TypeError(f"offset must be an int, got {type(offset).__name__}")
    offset = int(offset)
    if not -MAX_POSITION <= offset <= MAX_POSITION:
        raise ValueError(f"offset out of range: {offset}; positions are exact for |position| "
                         f"<= 2**31 - 1")
    return offset


def check_flag(flag, name) -> bool:
    """``flag`` as a bool (a Python or NumPy bool; anything else is a TypeError)."""
    if not isinstance(flag, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    return bool(flag)


def check_positions(pos, names="positions + offset + seq_offsets"):
    """Every final position (an int64 array on the host) within the exact range."""
    if pos.size and int(np.abs(pos).max()) > MAX_POSITION:
        raise ValueError(f"{names} reach {int(np.abs(pos).max())}: positions are exact for "
                         f"|position| <= 2**31 - 1")


def check_float(info, name):
    if info.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must have dtype float32, float16 or bfloat16, got {info.dtype}")


def check_last_dim(info, name, what="the last (head) dim"):
    if info.strides[-1] != 1 and info.shape[-1] > 1 and info.size > 0:
        raise ValueError(f"{name}: {what} must be contiguous (stride 1), got stride "
                         f"{info.strides[-1]}")


def check_tensor(info, name, layout, rotary_dim, head_rows=None):
    """A rotated tensor: dtype, rank for ``layout``, R <= D, a contiguous last
    dim, and (per-head tables) one table row per head."""
    check_float(info, name)
    if len(info.shape) != ndim(layout):
        fits = "'thd'" if len(info.shape) == 3 else "'bshd' or 'bhsd'"
        hint = (f"; RopeConfig(..., layout={fits}) reads a {len(info.shape)}-dim tensor"
                if len(info.shape) in (3, 4) else "")
        raise ValueError(f"{name} must be {DIMS[layout]} for layout {layout!r}, "
                         f"got shape {tuple(info.shape)}{hint}")
    d = info.shape[-1]
    if rotary_dim > d:
        raise ValueError(f"rotary_dim ({rotary_dim}) must be <= the head dim of {name} ({d})")
    check_last_dim(info, name)
    if head_rows is not None:
        h = canon_sizes(info.shape, layout)[2]
        if head_rows != h:
            raise ValueError(f"{name} has {h} heads but the per-head inv_freq table has "
                             f"{head_rows} rows")


def check_same_kind(a, b, na, nb):
    """Two inputs from the same framework, on the same device, of one dtype."""
    if a.kind != b.kind:
        raise TypeError(f"{na} and {nb} must come from the same framework, got {a.kind} and "
                        f"{b.kind}")
    if a.device != b.device:
        raise ValueError(f"{na} and {nb} are on different devices ({a.device} and {b.device})")
    if a.dtype != b.dtype:
        raise TypeError(f"{na} and {nb} must share a dtype, got {a.dtype} and {b.dtype}")


def check_out(out, src, name):
    """An output given for ``src``: same framework, shape, dtype and device, writable."""
    if out.kind == src.kind == "jax":
        raise TypeError("JAX arrays are immutable: out= and inplace=True are not supported for them")
    check_like(out, src, name)
    check_writable(out, name)


def check_like(out, src, name):
    """An array read beside ``src`` (a gradient of it): same framework, shape,
    dtype and device, a contiguous last dim."""
    if out.kind != src.kind:
        raise TypeError(f"{name} must be a {src.kind} array like its input, got {out.kind}")
    if tuple(out.shape) != tuple(src.shape) or out.dtype != src.dtype:
        raise ValueError(f"{name} must have shape {tuple(src.shape)} and dtype {src.dtype}, "
                         f"got {tuple(out.shape)} {out.dtype}")
    if out.device != src.device:
        raise ValueError(f"{name} is on device {out.device} but its input is on {src.device}")
    check_last_dim(out, name, "the last dim")


def check_writable(info, name):
    flags = getattr(info.array, "flags", None)
    if flags is not None and hasattr(flags, "writeable") and not flags.writeable:
        raise ValueError(f"{name} is read-only")


def same_view(a, b) -> bool:
    return a.ptr == b.ptr and tuple(a.strides) == tuple(b.strides)


def check_overlaps(out_infos, infos, any_input=False):
    """Outputs may be exactly an input (their own, or any input when
    ``any_input``), never partly one, nor each other."""
    for i, o in enumerate(out_infos):
        for j, src in enumerate(infos):
            if overlaps(o, src) and not ((any_input or i == j) and same_view(o, src)):
                raise ValueError("out overlaps an input without being exactly that input; "
                                 "use inplace=True (or out=input) for in-place rotation")
    if len(out_infos) == 2 and overlaps(out_infos[0], out_infos[1]):
        raise ValueError("the two outputs overlap")


def check_index(info, name, device, shapes, hint=None):
    """An int32/int64 index tensor (positions, seq_offsets) of one of
    ``shapes``; ``hint(shape)``: a tail for the wrong-shape message."""
    if info.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name} must have dtype int32 or int64, got {info.dtype}")
    if info.device != device:
        where = "host" if info.device < 0 else f"cuda:{info.device}"
        there = "host" if device < 0 else f"cuda:{device}"
        raise ValueError(f"{name} is on {where} but the tensors are on {there}")
    if tuple(info.shape) not in shapes:
        raise ValueError(f"{name} must have shape " + " or ".join(str(list(s)) for s in shapes)
                         + f", got {list(info.shape)}" + (hint(tuple(info.shape)) if hint else ""))


def check_indices(config, device, b, s, pos_info, seq_info, shape=None):
    """positions ``[S]``, ``[B, S]`` or ``[T]`` (with a leading stream axis
    under a stream map) and seq_offsets ``[B]``, contiguous; either may be
    None, except both for ``thd`` (its tokens' positions are never guessed).
    ``shape``: the rotated tensor's, to name ``layout=`` when positions fit
    its head axis instead of its sequence axis."""
    n_str = config.n_streams
    if config.layout == "thd" and pos_info is None and seq_info is None:
        raise ValueError("layout 'thd' needs positions= ([T]: each packed token's position in "
                         "its own sequence, e.g. cuprope.positions.packed_positions(cu_seqlens); "
                         "seq_offsets= [1] instead for one sequence): packed tokens have no "
                         "implicit positions")
    if config.layout == "thd":
        pshapes = [(s,)] if n_str == 1 else [(n_str, s)]
    else:
        pshapes = [(s,), (b, s)] if n_str == 1 else [(n_str, s), (n_str, b, s)]

    def hint(got):
        if shape is None or config.layout not in OTHER_LAYOUT:
            return ""
        h = canon_sizes(shape, config.layout)[2]
        lead = () if n_str == 1 else (n_str,)
        return swapped_layout_hint(config.layout, shape, f"positions fit axis {{head}} ({h})",
                                   h != s and got in (lead + (h,), lead + (b, h)))

    if pos_info is not None:
        check_index(pos_info, "positions", device, pshapes, hint)
    if seq_info is not None:
        check_index(seq_info, "seq_offsets", device, [(b,)])
        if seq_info.strides[0] != 1 and b > 1:
            raise ValueError("seq_offsets must be contiguous")


def check_tokens(n, what="B*S"):
    if n > MAX_TOKENS:
        raise ValueError(f"at most {MAX_TOKENS} tokens ({what}) per call, got {n}")


def validate_call(xs, names, layout, rotary_dim, outs, inplace, head_rows=None):
    """Describe and check the rotated tensors (one, or q and k) and their
    outputs. Returns (infos, out_infos or None, (B, S, D))."""
    infos = [describe(x, n) for x, n in zip(xs, names)]
    bsd = check_rotated(infos, names, layout, rotary_dim, head_rows)
    return infos, output_infos(infos, names, outs, inplace), bsd


def check_rotated(infos, names, layout, rotary_dim, head_rows=None):
    """The rotated tensors (one, or q and k sharing B, S, D, dtype, framework
    and device). Returns (B, S, D)."""
    for info, n in zip(infos, names):
        check_tensor(info, n, layout, rotary_dim, head_rows)
    b, s, _ = canon_sizes(infos[0].shape, layout)
    d = infos[0].shape[-1]
    if len(infos) == 2:
        q, k = infos
        check_same_kind(q, k, *names)
        if (b, s) != canon_sizes(k.shape, layout)[:2]:
            what = "token count" if layout == "thd" else "batch and sequence sizes"
            head = canon_sizes(q.shape, layout)[2]
            seqs = (s, canon_sizes(k.shape, layout)[1])  # heads, if the layout is the other one
            fits = (layout in OTHER_LAYOUT and len(k.shape) == 4 and q.shape[0] == k.shape[0]
                    and head == canon_sizes(k.shape, layout)[2] and min(seqs) > 0
                    and seqs[0] % seqs[1] == 0)
            raise ValueError(f"{names[0]} and {names[1]} must have the same {what}, "
                             f"got {(b, s)} and {canon_sizes(k.shape, layout)[:2]}"
                             + swapped_layout_hint(layout, q.shape, f"{names[0]} and {names[1]} "
                                                   "differ on axis {seq} and agree on axis {head}",
                                                   fits))
        if k.shape[-1] != d:
            raise ValueError(f"{names[0]} and {names[1]} must have the same head dim, "
                             f"got {d} and {k.shape[-1]}")
    check_tokens(b * s)
    return b, s, d


def output_infos(infos, names, outs, inplace, any_input=False):
    """The outputs' infos (the inputs' own when ``inplace``; None for new
    arrays), checked against the inputs."""
    if inplace:
        if outs is not None:
            raise ValueError("give either out= or inplace=True, not both")
        if infos[0].kind == "jax":
            raise TypeError("JAX arrays are immutable: inplace=True is not supported for them")
        for info, n in zip(infos, names):
            check_writable(info, n)
        out_infos = infos
    elif outs is not None:
        out_infos = [describe(o, "out") for o in outs]
        for o, src in zip(out_infos, infos):
            check_out(o, src, "out")
    else:
        return None
    check_overlaps(out_infos, infos, any_input)
    return out_infos


def _table_strides(info, name, layout, b, s):
    """(batch stride, sequence stride) of a cos/sin table, after checking it."""
    shape, st = tuple(info.shape), info.strides
    r = shape[-1] if shape else 0
    if layout == "thd":
        if shape != (s, r):
            raise ValueError(f"{name} must be [T, R] = [{s}, R] for layout 'thd', got {list(shape)}")
        return 0, st[0]
    if len(shape) == 2 and shape[0] == s:
        return 0, st[0]
    if len(shape) == 3 and shape[1] == s and shape[0] in (1, b):
        return (st[0] if shape[0] > 1 else 0), st[1]
    raise ValueError(f"{name} must be [B, S, R], [1, S, R] or [S, R] with B = {b}, S = {s}, "
                     f"got {list(shape)}")


def check_tables(cinfo, sinfo, x0, b, s, layout):
    """The cos/sin tables of ``cuprope.tables``: x's dtype and device, a
    contiguous last dim, one shape and strides, ``[B, S, R]``, ``[1, S, R]``,
    ``[S, R]`` or ``[T, R]``. Returns their (batch, sequence) strides."""
    for info, name in ((cinfo, "cos"), (sinfo, "sin")):
        if info.dtype != x0.dtype:
            raise TypeError(f"{name} must have the tensors' dtype {x0.dtype} (HF casts its "
                            f"tables to the activations' dtype), got {info.dtype}")
        if info.device != x0.device:
            where = "host" if info.device < 0 else f"cuda:{info.device}"
            raise ValueError(f"{name} is on {where} but the tensors are not")
        if info.shape:
            check_last_dim(info, name, "the last dim")
    if tuple(cinfo.shape) != tuple(sinfo.shape):
        raise ValueError(f"cos and sin must have the same shape, got {list(cinfo.shape)} "
                         f"and {list(sinfo.shape)}")
    tc = _table_strides(cinfo, "cos", layout, b, s)
    ts = _table_strides(sinfo, "sin", layout, b, s)
    if tc != ts:
        raise ValueError(f"cos and sin must have the same strides, got {cinfo.strides} "
                         f"and {sinfo.strides}")
    return tc


def table_rotary_dim(cinfo):
    """R, the tables' last dim: even and >= 2."""
    r = cinfo.shape[-1] if cinfo.shape else 0
    if r < 2 or r % 2:
        raise ValueError(f"the tables' last dim R must be even and >= 2, got {r}")
    return r


def check_bnhd(info, name):
    """A ``[B, N, H, D]`` or ``[B, N, D]`` tensor of floats, D even, a contiguous last dim."""
    check_float(info, name)
    if len(info.shape) not in (3, 4):
        raise ValueError(f"{name} must be [B, N, H, D] or [B, N, D], got shape {tuple(info.shape)}")
    d = info.shape[-1]
    if d < 2 or d % 2:
        raise ValueError(f"{name}: the head dim D must be even and >= 2 (pairs (i, i + D/2)), "
                         f"got D = {d}")
    check_last_dim(info, name)
