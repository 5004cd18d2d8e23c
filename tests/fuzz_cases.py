"""Random configurations for tests/test_fuzz.py: one generator per family.

Case i of a run draws everything from ``np.random.default_rng([seed, i])``,
so it can be rebuilt alone. A generator returns a :class:`Case`: the arrays of
the call (each a view into a buffer whose other elements are sentinels), the
call, and per output the float64 expectation with the suite's tolerance rule:

* core, schemes: ``oracle.expected`` (cuprope.reference) and
  ``oracle.assert_matches`` (fp32 within 1e-6·max|x|·scale, fp16/bf16 one
  ulp of the rounded reference plus that slack), as test_gpu_rope.py and
  test_gpu_schemes.py;
* tables: ``reference.rotate_with_tables`` rounded to the dtype, bit for bit,
  as test_tables.py (HF's formula with PyTorch's roundings);
* ggml: test_ggml.py's transcription of ggml's C loop, ``assert_matches`` with
  its magnitude (``c_mscale``);
* lrpe: ``lrpe.forward_reference`` / ``backward_reference`` with
  test_gpu_lrpe.py's per-activation rule (``check``, ``act_grad_bound``).

Every array lives in a larger buffer (some with permuted memory order,
padding on any axis, a start a few elements in); elements outside the views
are NaN (floats) or -1 (indices) and must not change, nor may the inputs'
buffers unless they are the target of ``inplace=True`` / ``out=input``.
Dims the call passes through must come back bit for bit.

Values are normal samples rounded to bfloat16, away from 0, so they are exact
in every dtype and one float64 reference serves all.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import ml_dtypes
import numpy as np

import cuprope
from cuprope import ggml, lrpe, reference, scaling, tables
from oracle import assert_matches, from_canon, to_canon
from oracle import expected as rope_expected
from test_ggml import c_mscale, c_rope
from test_gpu_lrpe import ACT_DIMS, act_grad_bound
from test_gpu_lrpe import check as lrpe_check

BF16 = np.dtype(ml_dtypes.bfloat16)
NP_DTYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "bfloat16": BF16}
DTYPES = list(NP_DTYPES)
LAYOUTS = ["bshd", "bhsd", "thd"]
POS_MAX = 2 ** 31 - 1      # exactness is promised for positions up to here
HEAD_DIMS = [2, 4, 6, 8, 16, 32, 48, 64, 64, 80, 96, 112, 128, 128, 160, 192, 256, 512, 1024]
SEQ_LENS = [1, 1, 2, 3, 5, 7, 8, 16, 17, 31, 33, 64, 100, 129, 300]
MAX_ELEMENTS = 2 ** 17     # per call, inputs together: keeps the host references quick


def _has_torch():
    try:
        import torch  # noqa: F401
        return True
    except Exception:
        return False


HAS_TORCH = _has_torch()
ON_GPU = False
if HAS_TORCH and cuprope.gpu_available():
    import torch
    ON_GPU = torch.cuda.is_available()


def pick(rng, seq):
    return seq[int(rng.integers(len(seq)))]


# --------------------------------------------------------------------------- backends

_CUPY_BF16 = []


def _cupy_has_bf16():
    if not _CUPY_BF16:
        try:
            import cupy
            cupy.asarray(np.ones(2, BF16))
            _CUPY_BF16.append(True)
        except Exception:
            _CUPY_BF16.append(False)
    return _CUPY_BF16[0]


class Backend:
    """Where a case's arrays live: "numpy", "torch" (CPU tensors), "torch-cuda"
    or "cupy". Arrays are uploaded from host buffers and read back as float64
    (values) or unsigned ints (bits)."""

    def __init__(self, name):
        self.name = name
        self.gpu = name in ("torch-cuda", "cupy")
        self.torch = name.startswith("torch")

    def upload(self, host):
        if self.name == "numpy":
            return host.copy()
        if self.name == "cupy":
            import cupy
            return cupy.asarray(host)
        import torch
        t = torch.from_numpy((host.view(np.int16) if host.dtype == BF16 else host).copy())
        if host.dtype == BF16:
            t = t.view(torch.bfloat16)
        return t.to("cuda") if self.name == "torch-cuda" else t

    def view(self, flat, ops):
        lead, size, pshape, slices, perm = ops
        v = flat[lead:lead + size].reshape(pshape)[slices]
        return v.permute(perm) if self.torch else v.transpose(perm)

    def host(self, a):
        """A NumPy array of ``a``'s values (bfloat16 as ml_dtypes)."""
        if self.name == "numpy":
            return np.asarray(a)
        if self.name == "cupy":
            import cupy
            return cupy.asnumpy(a)
        import torch
        a = a.detach()
        if a.dtype == torch.bfloat16:
            return a.view(torch.int16).cpu().numpy().view(BF16)
        return a.cpu().numpy()

    def to64(self, a):
        return self.host(a).astype(np.float64)

    def bits(self, flat):
        h = np.ascontiguousarray(self.host(flat))
        return h.view(f"u{h.dtype.itemsize}")

    def dtype_name(self, a):
        return str(a.dtype).replace("torch.", "") if self.torch else np.dtype(a.dtype).name

    def current_stream(self):
        if self.name == "cupy":
            import cupy
            return cupy.cuda.get_current_stream()
        import torch
        return torch.cuda.current_stream()


def draw_dtype(rng):
    """(dtype name, Backend, NumPy dtype). The backend takes one draw whatever
    the machine: a case is the same configuration on the GPU and on the CPU,
    only where its arrays live differs."""
    dtype = pick(rng, DTYPES)
    return dtype, draw_backend(rng, dtype), NP_DTYPES[dtype]


def draw_backend(rng, dtype):
    u = rng.random()
    if ON_GPU:
        name = "cupy" if u < 0.25 else "torch-cuda"
        if name == "cupy" and dtype == "bfloat16" and not _cupy_has_bf16():
            name = "torch-cuda"
    else:
        name = "torch" if u < 0.25 and HAS_TORCH else "numpy"
    return Backend(name)


# --------------------------------------------------------------------------- buffers

@dataclass
class Placement:
    """Where an array sits in its buffer: the memory order of its axes (the
    last always last), extra elements per axis, where the view starts within
    that padding, elements before it (``lead``: misaligned when not a
    multiple of the vector width) and after it, and the stride of the last
    axis (> 1 for index arrays only)."""
    order: tuple
    pad: tuple
    start: tuple
    lead: int = 0
    tail: int = 0
    step: int = 1

    def __str__(self):
        if not any(self.pad) and self.lead == self.tail == 0 and self.step == 1 \
                and list(self.order) == sorted(self.order):
            return "contig"
        parts = []
        if list(self.order) != sorted(self.order):
            parts.append("order" + "".join(map(str, self.order)))
        if any(self.pad):
            parts.append("pad" + "".join(map(str, self.pad)) + "@" + "".join(map(str, self.start)))
        if self.lead:
            parts.append(f"lead{self.lead}")
        if self.step > 1:
            parts.append(f"step{self.step}")
        return "+".join(parts) or "margins"


def draw_placement(rng, ndim, *, plain_p=0.4, margin=False, step=False, order=None):
    plain = rng.random() < plain_p
    if order is None:
        order = list(range(ndim - 1))
        if not plain and ndim > 2 and rng.random() < 0.35:
            rng.shuffle(order)
        order = tuple(order) + (ndim - 1,)
    pad = tuple(0 if plain or rng.random() >= 0.3 else int(rng.integers(1, 4)) for _ in range(ndim))
    start = tuple(int(rng.integers(0, p + 1)) for p in pad)
    lead = 0 if plain else int(pick(rng, [0, 0, 1, 2, 3, 5, 8]))
    tail = 0 if plain else int(rng.integers(0, 3))
    if margin:  # outputs: always something around the view to poison
        lead, tail = (lead or int(rng.integers(0, 2))), max(tail, 1)
    st = int(pick(rng, [1, 2, 3])) if step and not plain else 1
    return Placement(tuple(order), pad, start, lead, tail, st)


@dataclass
class View:
    name: str
    ops: tuple          # (lead, size, physical shape, slices, axis permutation)
    idx: np.ndarray     # flat index of every element, in the view's shape
    written: bool       # the call may write it (an output, or an input rotated in place)


class Buf:
    """A host buffer, sentinels included, and the views the call receives."""

    def __init__(self, host, views, placement):
        self.host, self.views, self.placement = host, views, placement
        self.host_bits = host.view(f"u{host.dtype.itemsize}").copy()
        self.written = np.zeros(host.size, bool)
        for v in views:
            if v.written:
                self.written[v.idx] = True

    def materialize(self, backend):
        flat = backend.upload(self.host)
        return flat, {v.name: backend.view(flat, v.ops) for v in self.views}


def make_buf(rng, npdt, parts, *, axis=None, extra=0, placement=None, **draw):
    """One buffer holding ``parts`` = [(name, shape, float64 values or None,
    written)] side by side along ``axis`` (with ``extra`` unused elements
    after them there), at ``placement`` (drawn when None, ``draw`` passed on).
    Elements outside the views hold NaN (floats) or -1 (integers)."""
    shape0 = parts[0][1]
    ndim = len(shape0)
    pl = placement or draw_placement(rng, ndim, **draw)
    ext = list(shape0)
    if axis is not None:
        axis %= ndim
        ext[axis] = sum(p[1][axis] for p in parts) + extra
    ext = [e + p for e, p in zip(ext, pl.pad)]
    ext[-1] *= pl.step
    pshape = tuple(ext[a] for a in pl.order)
    size = math.prod(pshape)
    fill = np.nan if npdt.kind == "f" else -1
    host = np.full(pl.lead + size + pl.tail, fill, dtype=npdt)
    flat_idx = np.arange(host.size)
    perm = tuple(int(a) for a in np.argsort(pl.order))
    views, base = [], 0
    for name, shape, values, written in parts:
        assert all(shape[a] == shape0[a] for a in range(ndim) if a != axis), (shape, shape0)
        sl = [slice(pl.start[a] + (base if a == axis else 0),
                    pl.start[a] + (base if a == axis else 0) + shape[a]) for a in range(ndim)]
        sl[-1] = slice(sl[-1].start * pl.step, sl[-1].stop * pl.step, pl.step)
        ops = (pl.lead, size, pshape, tuple(sl[a] for a in pl.order), perm)
        idx = np.array(Backend("numpy").view(flat_idx, ops))
        if values is not None:
            host[idx] = np.asarray(values).astype(npdt)
        views.append(View(name, ops, idx, written))
        if axis is not None:
            base += shape[axis]
    return Buf(host, views, pl)


def exact_values(rng, shape, mag_p=0.2, mag=8):
    """Normal samples rounded to bfloat16, |v| >= 2^-6 (never 0), sometimes
    scaled by a power of two up to 2^±mag: exact in all three dtypes."""
    v = reference.round_to_dtype(rng.standard_normal(shape), BF16).astype(np.float64)
    v = np.where(np.abs(v) < 2.0 ** -6, np.copysign(0.5, v), v)
    if rng.random() < mag_p:
        v = v * 2.0 ** int(rng.integers(-mag, mag + 1))
    return v


# --------------------------------------------------------------------------- cases

@dataclass
class Expect:
    """One output: the float64 expectation and the rule comparing it, the input
    it must look like (type, dtype, shape), the array it must be (``out=``,
    in place) and the last-axis start of the dims that must pass through bit
    for bit (with the input values they hold)."""
    name: str
    value: np.ndarray
    rule: Callable
    like: str
    target: str | None = None
    keep: tuple | None = None


@dataclass
class Case:
    family: str
    desc: str
    backend: Backend
    bufs: list
    invoke: Callable            # invoke(arrays by name) -> the call's result
    expects: list
    warm: bool = False          # GPU: a first call on copies, so this one takes the cached plan
    tags: dict = field(default_factory=dict)


def ulp_rule(xmax, dtype, scale=1.0):
    def rule(got, want):
        assert_matches(got, want, xmax, dtype, scale)
    return rule


def assert_bitwise(got, want):
    bad = ~(got == want)
    if bad.any():
        i = tuple(int(j) for j in np.argwhere(bad)[0])
        raise AssertionError(f"{int(bad.sum())} of {bad.size} elements differ from the bit-exact "
                             f"reference; first at {i}: out={got[i]!r} ref={want[i]!r}")


def check_output(be, res, ex, arrays):
    """One output: what it is, its values, its pass-through dims."""
    like = arrays[ex.like]
    if ex.target is not None:
        assert res is arrays[ex.target], f"the result is not the {ex.target} array passed"
    assert type(res) is type(like), f"a {type(res).__name__} for a {type(like).__name__}"
    got_as = (be.dtype_name(res), tuple(res.shape))
    want_as = (be.dtype_name(like), tuple(like.shape))
    assert got_as == want_as, f"{got_as} for an input of {want_as}"
    if be.torch:
        assert res.device == like.device, f"on {res.device}, the input on {like.device}"
    got = be.to64(res)
    ex.rule(got, ex.value)
    if ex.keep is not None:
        start, x64 = ex.keep
        bad = int(np.sum(~(got[..., start:] == x64[..., start:])))
        assert not bad, f"{bad} pass-through elements (dims >= {start}) changed"


def run_case(case):
    """Run the call and check every output, the pass-through dims and the
    sentinels. Raises AssertionError (or whatever the call raised)."""
    be = case.backend
    arrays, flats = {}, []
    for buf in case.bufs:
        flat, views = buf.materialize(be)
        flats.append(flat)
        arrays.update(views)
    if case.warm and be.gpu:
        copies = {}
        for buf in case.bufs:
            copies.update(buf.materialize(be)[1])
        case.invoke(copies)
    result = case.invoke(arrays)
    results = result if isinstance(result, tuple) else (result,)
    assert len(results) == len(case.expects), f"{len(results)} results for {len(case.expects)}"
    for res, ex in zip(results, case.expects):
        try:
            check_output(be, res, ex, arrays)
        except AssertionError as e:
            raise AssertionError(f"{ex.name}: {e}") from None
    for buf, flat in zip(case.bufs, flats):
        stray = (be.bits(flat) != buf.host_bits) & ~buf.written
        if stray.any():
            names = "/".join(v.name for v in buf.views)
            raise AssertionError(f"buffer of {names}: {int(stray.sum())} elements outside what the "
                                 f"call may write changed (first at flat index "
                                 f"{int(np.argmax(stray))} of {stray.size})")


# --------------------------------------------------------------------------- shared draws

def draw_sizes(rng, heads, d, seq_lens=SEQ_LENS, long=False):
    """(B, S) under MAX_ELEMENTS for these head counts and head dim. ``long``
    (per-head tables: token runs need S of 64 to 512 and more) draws a long
    sequence half the time and gives up batch first to keep it."""
    b, s = int(pick(rng, [1, 1, 2, 3, 4, 5])), int(pick(rng, seq_lens))
    if long and rng.random() < 0.5:
        s = int(pick(rng, [64, 129, 300, 600, 1100]))
    while b * s * sum(heads) * d > MAX_ELEMENTS and (s > 1 or b > 1):
        if s > 1 and not (long and b > 1):
            s = (s + 1) // 2
        else:
            b -= 1
    return b, s


def shape_for(layout, b, s, h, d):
    return {"bshd": (b, s, h, d), "bhsd": (b, h, s, d), "thd": (b * s, h, d)}[layout]


def canon_bs(layout, b, s):
    """(B, S) as the API sees them: packed tokens are one sequence of B·S."""
    return (1, b * s) if layout == "thd" else (b, s)


def head_axis(layout):
    return 2 if layout == "bshd" else 1


def fused_order(layout):
    """Memory order of a fused projection [.., heads, D] viewed in ``layout``."""
    return {"bshd": (0, 1, 2, 3), "bhsd": (0, 2, 1, 3), "thd": (0, 1, 2)}[layout]


def place_inputs(rng, npdt, names, shapes, values, written, layout, fuse_p=0.3, extra_max=4):
    """Buffers for the rotated inputs: q and k as head slices of one fused
    projection [.., (Hq + 2·Hk)·D] (v's heads after them; sometimes another
    count), or each in its own buffer. Returns (bufs, desc)."""
    if len(names) > 1 and rng.random() < fuse_p:
        ndim = len(shapes[0])
        pl = draw_placement(rng, ndim, plain_p=0.5, order=fused_order(layout))
        ax = head_axis(layout)
        extra = shapes[-1][ax] if rng.random() < 0.7 else int(rng.integers(0, extra_max + 1))
        buf = make_buf(rng, npdt, list(zip(names, shapes, values, [written] * len(names))),
                       axis=ax, extra=extra, placement=pl)
        return [buf], f"fused[+{extra}]:{pl}"
    bufs = [make_buf(rng, npdt, [(n, sh, v, written)]) for n, sh, v in zip(names, shapes, values)]
    return bufs, ",".join(str(b.placement) for b in bufs)


FORMS = ["new", "new", "out", "out", "inplace", "out=input"]


def place_outputs(rng, npdt, names, shapes, layout, form):
    """Buffers for ``out=`` (all NaN, margins around), else none."""
    if form != "out":
        return [], ""
    outs = ["out_" + n for n in names]
    if len(names) > 1 and rng.random() < 0.3:
        buf = make_buf(rng, npdt, [(o, sh, None, True) for o, sh in zip(outs, shapes)],
                       axis=head_axis(layout), extra=int(rng.integers(0, 3)), margin=True)
        return [buf], f" out:fused:{buf.placement}"
    bufs = [make_buf(rng, npdt, [(o, sh, None, True)], margin=True) for o, sh in zip(outs, shapes)]
    return bufs, " out:" + ",".join(str(b.placement) for b in bufs)


def output_kwargs(form, names, arrays):
    """The out=/inplace= arguments of a call for its output form."""
    if form == "out":
        outs = tuple(arrays["out_" + n] for n in names)
    elif form == "out=input":
        outs = tuple(arrays[n] for n in names)
    else:
        return {"inplace": True} if form == "inplace" else {}
    return {"out": outs if len(outs) > 1 else outs[0]}


def output_target(form, name):
    return {"out": "out_" + name, "inplace": name, "out=input": name}.get(form)


@dataclass
class Operands:
    """The rotated tensors of a call: names, float64 values, output form, the
    buffers of the inputs and of out=, and a description."""
    names: list
    x64: list
    form: str
    bufs: list
    desc: str

    def expects(self, want, rule, keep=None):
        """Expect per tensor: want(values) under ``rule``; dims >= ``keep`` pass through."""
        return [Expect(n, want(x), rule, n, output_target(self.form, n),
                       None if keep is None else (keep, x)) for n, x in zip(self.names, self.x64)]


def draw_operands(rng, npdt, layout, names, shapes, forms=FORMS):
    x64 = [exact_values(rng, sh) for sh in shapes]
    form = pick(rng, forms)
    in_bufs, in_desc = place_inputs(rng, npdt, names, shapes, x64,
                                    form in ("inplace", "out=input"), layout)
    out_bufs, out_desc = place_outputs(rng, npdt, names, shapes, layout, form)
    return Operands(names, x64, form, in_bufs + out_bufs, f"in:{in_desc} form={form}{out_desc}")


def draw_budget(rng, span):
    """The largest position a call may reach: small, mid-range, or within 100 of 2³¹ − 1."""
    r = rng.random()
    if r < 0.55:
        return int(rng.integers(span, span + 5000))
    if r < 0.8:
        return int(rng.integers(span, 2 ** 24))
    return POS_MAX - int(rng.integers(0, 100))


@dataclass
class Positions:
    arrays: dict        # call argument -> array name ("positions", "seq_offsets")
    consts: dict        # call argument -> value ("offset")
    host: dict          # the reference's arguments (NumPy)
    bufs: list
    desc: str


def draw_positions(rng, layout, b, s, n_streams):
    """positions (none, [S], [B, S], [T], a leading stream axis for several
    streams; int32/int64, sometimes strided; thd: [T] unless seq_offsets is
    drawn), offset and seq_offsets, with
    offset + seq_offset + position <= budget <= 2³¹ − 1. b, s: canonical."""
    kind = pick(rng, ["none", "none", "S"] + (["BS"] if layout != "thd" else []))
    idt = np.dtype(pick(rng, ["int32", "int64"]))
    has_off, has_seq = rng.random() < 0.5, rng.random() < 0.3
    if layout == "thd" and kind == "none" and not has_seq:
        kind = "S"  # packed tokens take positions or seq_offsets, never implicit ones
    implicit_span = s - 1 if kind == "none" else 0
    budget = draw_budget(rng, implicit_span)
    comps = [c for c, on in (("off", has_off), ("seq", has_seq), ("pos", kind != "none")) if on]
    share = rng.dirichlet(np.ones(len(comps))) if comps else []
    cap = {c: int(f * (budget - implicit_span)) for c, f in zip(comps, share)}
    arrays, consts, host, bufs, desc = {}, {}, {}, [], []

    def spread_below(top, size):
        lo = 0 if rng.random() < 0.5 else max(0, top - 5000)
        return rng.integers(lo, top + 1, size=size, dtype=np.int64)

    if kind != "none":
        shape = (s,) if kind == "S" else (b, s)
        if n_streams > 1:
            shape = (n_streams,) + shape
        vals = spread_below(cap["pos"], shape)
        buf = make_buf(rng, idt, [("pos", shape, vals, False)], plain_p=0.5, step=True)
        arrays["positions"], host["positions"] = "pos", vals
        bufs.append(buf)
        desc.append(f"pos{list(shape)}{idt.name[3:]}:{buf.placement}")
    if has_off:
        off = cap["off"] - int(rng.integers(0, min(cap["off"], 50) + 1))
        consts["offset"] = host["offset"] = np.int64(off) if rng.random() < 0.1 else off
        desc.append(f"off={off}")
    if has_seq:
        sdt = np.dtype(pick(rng, ["int32", "int64"]))
        vals = spread_below(cap["seq"], (b,))
        buf = make_buf(rng, sdt, [("seq", (b,), vals, False)], plain_p=0.6)
        arrays["seq_offsets"], host["seq_offsets"] = "seq", vals
        bufs.append(buf)
        desc.append(f"seq_off{sdt.name[3:]}:{buf.placement}")
    top = sum(int(np.max(host[k])) for k in ("offset", "seq_offsets") if k in host)
    top += int(np.max(host["positions"])) if "positions" in host else s - 1
    assert top <= POS_MAX
    desc.append(f"maxpos={top}")
    return Positions(arrays, consts, host, bufs, " ".join(desc))


def draw_rotary(rng, d):
    return d if rng.random() < 0.5 else 2 * int(rng.integers(1, d // 2 + 1))


def draw_heads(rng, qk, per_head):
    """[Hq, Hk] (GQA/MQA: Hq a multiple of Hk) or [H]; equal for per-head tables."""
    if per_head:
        h = int(rng.integers(1, 7))
        return [h, h] if qk else [h]
    hk = int(pick(rng, [1, 1, 2, 3, 4, 8]))
    if not qk:
        return [int(pick(rng, [1, 2, 3, 4, 8, 16]))]
    return [hk * int(pick(rng, [1, 1, 2, 4, 8])), hk]


def finish_call(rng, backend, use_stream_p=0.1):
    """(warm, stream kwargs): GPU only, but drawn everywhere so that a case is
    the same configuration on every machine."""
    warm = rng.random() < 0.25
    stream = rng.random() < use_stream_p
    return warm, ({"stream": backend.current_stream()} if stream and backend.gpu else {})


# --------------------------------------------------------------------------- core and schemes

def core_config(rng, d, layout, interleaved):
    """RopeConfig with the default table (several bases), a shared custom
    table, or one row per head (filled in by the caller: ``heads``)."""
    r = draw_rotary(rng, d)
    scale = 1.0 if rng.random() < 0.7 else float(rng.uniform(0.5, 2.0))
    kind = pick(rng, ["base", "base", "inv", "per-head"])
    kw = dict(interleaved=interleaved, layout=layout, scale=scale)
    if kind == "base":
        base = float(pick(rng, [10000.0, 500000.0, 1e6, 100.0, 10.0]))
        return (lambda heads: cuprope.RopeConfig(r, base=base, **kw)), f"R{r} base={base:g}", False
    lo = pick(rng, [1e-6, 1e-4, 1e-2])
    rows = (r // 2,) if kind == "inv" else None

    def build(heads):
        shape = rows or (heads, r // 2)
        return cuprope.RopeConfig(r, inv_freq=rng.uniform(lo, 1.0, shape), **kw)
    return build, f"R{r} {kind}[{lo:g},1)", kind == "per-head"


SCHEMES = ["linear", "dynamic", "yarn", "longrope", "llama3", "proportional", "hf",
           "mrope", "imrope", "vision2d", "streams"]


def _yarn(rng, r, base):
    extra = dict(mscale=0.707, mscale_all_dim=1.0) if rng.random() < 0.3 else {}
    return scaling.yarn_table(r, base, float(pick(rng, [2.0, 4.0, 8.0, 32.0, 40.0])),
                              original_max_position_embeddings=int(pick(rng, [2048, 4096, 32768])),
                              beta_fast=float(pick(rng, [32.0, 24.0])),
                              beta_slow=float(pick(rng, [1.0, 2.0])),
                              truncate=rng.random() < 0.7, **extra)


def _hf_dict(rng, d, base):
    prf = pick(rng, [1.0, 1.0, 0.5, 0.25])
    if int(d * prf) % 2 or int(d * prf) == 0:
        prf = 1.0
    if int(d * prf) <= 2:
        return {"head_dim": d, "rope_theta": base}, "default"  # dynamic NTK needs R > 2
    rs = pick(rng, [None, {"rope_type": "linear", "factor": 4.0},
                    {"type": "dynamic", "factor": 2.0},
                    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096},
                    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}])
    cfg = {"head_dim": d, "hidden_size": 4 * d, "num_attention_heads": 4, "rope_theta": base,
           "partial_rotary_factor": prf, "max_position_embeddings": 16384}
    if rs is not None:
        cfg["rope_scaling"] = rs
    return cfg, (rs or {}).get("rope_type", (rs or {}).get("type", "default"))


def scheme_config(rng, d, layout, interleaved):
    """A RopeConfig from cuprope.scaling: a scaled table, an HF config dict, a
    multimodal stream map, or a random stream map (shared or per-head table)."""
    name = pick(rng, SCHEMES)
    r = draw_rotary(rng, d)
    base = float(pick(rng, [10000.0, 150000.0, 500000.0, 1e6]))
    kw = dict(layout=layout, interleaved=interleaved)
    if name == "vision2d" and d % 4:
        name = "mrope"
    if name == "dynamic" and r <= 2:
        name = "linear"
    desc = f"{name} R{r} base={base:g}"
    inv = None
    sc = 1.0
    if name == "linear":
        inv, sc = scaling.linear_table(r, base, float(pick(rng, [2.0, 4.0, 8.0])))
    elif name == "dynamic":
        max_pos = int(pick(rng, [2048, 4096]))
        inv, sc = scaling.dynamic_ntk_table(r, base, float(pick(rng, [2.0, 4.0])), max_pos,
                                            seq_len=int(rng.integers(max_pos // 2, 4 * max_pos)))
    elif name == "yarn":
        inv, sc = _yarn(rng, r, base)
    elif name == "longrope":
        inv, sc = scaling.longrope_table(
            r, base, rng.uniform(1, 3, r // 2), rng.uniform(1, 60, r // 2),
            original_max_position_embeddings=4096, factor=32.0,
            seq_len=int(pick(rng, [2048, 4096, 8192, 131072])))
    elif name == "llama3":
        inv, sc = scaling.llama3_table(r, base, float(pick(rng, [4.0, 8.0, 32.0])), 1.0, 4.0,
                                       int(pick(rng, [4096, 8192])))
    elif name == "proportional":
        prf = float(pick(rng, [0.25, 0.5, 1.0]))
        inv, sc = scaling.proportional_table(d, base, prf)
        r, desc = d, f"proportional {prf} D{d} base={base:g}"
    elif name == "hf":
        hf, kind = _hf_dict(rng, d, base)
        cfg = scaling.rope_config_from_hf(hf, seq_len=int(rng.integers(1, 40000)), **kw)
        return (lambda heads: cfg), f"hf:{kind} R{cfg.rotary_dim} base={base:g}", False
    if inv is not None:
        return (lambda heads: cuprope.RopeConfig(r, inv_freq=inv, scale=sc, **kw)), \
            desc + (f" scale={sc:.4g}" if sc != 1.0 else ""), False
    sc = 1.0 if rng.random() < 0.6 else float(rng.uniform(0.5, 2.0))
    if name in ("mrope", "imrope"):
        sec = [int(v) for v in rng.multinomial(r // 2, [1 / 3] * 3)]
        table = None
        if rng.random() < 0.4:
            table, sc = _yarn(rng, r, base)
        build = scaling.mrope_config if name == "mrope" else scaling.interleaved_mrope_config
        cfg = build(sec, table, base=base, scale=sc, **kw)
        return (lambda heads: cfg), f"{name}{sec}{'+yarn' if table is not None else ''} " \
            f"R{r} base={base:g} scale={sc:.4g}", False
    if name == "vision2d":
        cfg = scaling.vision2d_config(d, base=base, scale=sc, **kw)
        return (lambda heads: cfg), f"vision2d D{d} base={base:g} scale={sc:.4g}", False
    # a random stream map, shared or per-head table
    n = int(rng.integers(1, 5))
    smap = rng.integers(0, n, r // 2)
    per_head = rng.random() < 0.3

    def build_streams(heads):
        shape = (heads, r // 2) if per_head else (r // 2,)
        return cuprope.RopeConfig(r, inv_freq=rng.uniform(1e-4, 1.0, shape), stream_map=smap,
                                  scale=sc, **kw)
    return build_streams, f"streams{int(smap.max()) + 1} R{r}{' per-head' if per_head else ''} " \
        f"scale={sc:.4g}", per_head


ROPE_FUNCS = {(False, False): cuprope.rope_forward, (False, True): cuprope.rope_qk_forward,
              (True, False): cuprope.rope_backward, (True, True): cuprope.rope_qk_backward}


def gen_rope(rng, family):
    """cuprope.rope_forward/backward and rope_qk_forward/backward with a
    RopeConfig drawn by ``core_config`` (family "core") or ``scheme_config``
    ("schemes")."""
    dtype, be, npdt = draw_dtype(rng)
    layout, qk, inverse = pick(rng, LAYOUTS), rng.random() < 0.55, rng.random() < 0.45
    d, interleaved = int(pick(rng, HEAD_DIMS)), rng.random() < 0.4
    build, cdesc, per_head = (core_config if family == "core" else scheme_config)(
        rng, d, layout, interleaved)
    heads = draw_heads(rng, qk, per_head)
    cfg = build(heads[0])
    b, s = draw_sizes(rng, heads, d, long=cfg.per_head)
    pos = draw_positions(rng, layout, *canon_bs(layout, b, s), cfg.n_streams)
    op = draw_operands(rng, npdt, layout, ["q", "k"] if qk else ["x"],
                       [shape_for(layout, b, s, h, d) for h in heads])
    warm, stream_kw = finish_call(rng, be)
    fn = ROPE_FUNCS[(inverse, qk)]

    def invoke(a):
        kw = {k: a[v] for k, v in pos.arrays.items()}
        kw.update(pos.consts, **output_kwargs(op.form, op.names, a), **stream_kw)
        return fn(*[a[n] for n in op.names], cfg, **kw)

    xmax = max(float(np.abs(x).max()) for x in op.x64)
    expects = op.expects(lambda x: rope_expected(x, cfg, inverse=inverse, **pos.host),
                         ulp_rule(xmax, dtype, cfg.scale),
                         cfg.rotary_dim if cfg.rotary_dim < d else None)
    desc = (f"{be.name} {dtype} {fn.__name__} {layout} B{b} S{s} H{heads} D{d} "
            f"{'interleaved' if interleaved else 'half'} {cdesc} {pos.desc} {op.desc}"
            f"{' warm' if warm else ''}{' stream=' if stream_kw else ''}")
    return Case(family, desc, be, op.bufs + pos.bufs, invoke, expects, warm,
                {"dtype": dtype, "layout": layout, "form": op.form, "backend": be.name})


def gen_core(rng):
    return gen_rope(rng, "core")


def gen_schemes(rng):
    return gen_rope(rng, "schemes")


# --------------------------------------------------------------------------- cos/sin tables

TABLE_FUNCS = {(False, False): tables.rope_table_forward,
               (False, True): tables.rope_qk_table_forward,
               (True, False): tables.rope_table_backward,
               (True, True): tables.rope_qk_table_backward}


def table_values(rng, tshape, interleaved, npdt):
    """cos and sin as HF's rotary embedding builds them (angles of positions
    times a default table, cat or repeat-interleaved, times an attention
    factor), or arbitrary values; rounded to the dtype. Returns (cos, sin, desc)."""
    r = tshape[-1]
    if rng.random() < 0.25:
        c, s = rng.uniform(-1.5, 1.5, tshape), rng.uniform(-1.5, 1.5, tshape)
        desc = "random"
    else:
        base = float(pick(rng, [10000.0, 500000.0, 1e6]))
        pos = rng.integers(0, draw_budget(rng, 0) + 1, size=tshape[:-1] + (1,))
        freqs = pos * cuprope.default_inv_freq(r, base)
        emb = np.repeat(freqs, 2, axis=-1) if interleaved else np.concatenate([freqs, freqs], -1)
        att = 1.0 if rng.random() < 0.7 else float(rng.uniform(0.5, 1.5))
        c, s = np.cos(emb) * att, np.sin(emb) * att
        desc = f"hf base={base:g} att={att:.3g} maxpos={int(pos.max())}"
    rnd = [reference.round_to_dtype(v, npdt).astype(np.float64) for v in (c, s)]
    return rnd[0], rnd[1], desc


def place_tables(rng, npdt, tshape, c64, s64):
    """cos and sin side by side in one buffer (along the last axis) or in two
    buffers placed alike (the API needs equal strides)."""
    if rng.random() < 0.3:
        buf = make_buf(rng, npdt, [("cos", tshape, c64, False), ("sin", tshape, s64, False)],
                       axis=-1, extra=int(rng.integers(0, 3)))
        return [buf], f"fused:{buf.placement}"
    pl = draw_placement(rng, len(tshape))
    bufs = [make_buf(rng, npdt, [(n, tshape, v, False)], placement=pl)
            for n, v in (("cos", c64), ("sin", s64))]
    return bufs, str(pl)


def table4(t64):
    """A [B|1, S, R] / [S, R] / [T, R] table as reference.rotate_with_tables
    reads it: [B|1, S, 1, R]."""
    t = t64[None] if t64.ndim == 2 else t64
    return t[:, :, None, :]


def gen_tables(rng):
    """cuprope.tables.rope_(qk_)table_forward/backward: HF's formula by the
    caller's cos/sin tables, bit for bit."""
    dtype, be, npdt = draw_dtype(rng)
    layout, qk, inverse = pick(rng, LAYOUTS), rng.random() < 0.55, rng.random() < 0.45
    d, interleaved = int(pick(rng, HEAD_DIMS[:-1])), rng.random() < 0.4
    r = draw_rotary(rng, d)
    heads = draw_heads(rng, qk, False)
    b, s = draw_sizes(rng, heads, d)
    cb, cs = canon_bs(layout, b, s)
    tkind = "TR" if layout == "thd" else pick(rng, ["BSR", "1SR", "SR"])
    tshape = {"TR": (cs, r), "BSR": (cb, cs, r), "1SR": (1, cs, r), "SR": (cs, r)}[tkind]
    c64, s64, vdesc = table_values(rng, tshape, interleaved, npdt)
    t_bufs, t_desc = place_tables(rng, npdt, tshape, c64, s64)
    op = draw_operands(rng, npdt, layout, ["q", "k"] if qk else ["x"],
                       [shape_for(layout, b, s, h, d) for h in heads])
    warm, stream_kw = finish_call(rng, be)
    fn = TABLE_FUNCS[(inverse, qk)]

    def invoke(a):
        return fn(*[a[n] for n in op.names], a["cos"], a["sin"], layout=layout,
                  interleaved=interleaved, **output_kwargs(op.form, op.names, a), **stream_kw)

    def want(x):
        y = reference.rotate_with_tables(to_canon(x, layout), table4(c64), table4(s64),
                                         interleaved=interleaved,
                                         inverse=inverse, dtype=npdt)
        return from_canon(reference.round_to_dtype(y, npdt).astype(np.float64), layout)

    expects = op.expects(want, assert_bitwise, r if r < d else None)
    desc = (f"{be.name} {dtype} {fn.__name__} {layout} B{b} S{s} H{heads} D{d} R{r} "
            f"{'interleaved' if interleaved else 'half'} tables{list(tshape)} {vdesc} "
            f"t:{t_desc} {op.desc}{' warm' if warm else ''}{' stream=' if stream_kw else ''}")
    return Case("tables", desc, be, op.bufs + t_bufs, invoke, expects, warm,
                {"dtype": dtype, "layout": layout, "form": op.form, "backend": be.name})


# --------------------------------------------------------------------------- ggml

GGML_DIMS = [4, 8, 12, 16, 24, 32, 48, 64, 80, 96, 128]


def ggml_sections(rng, mode, n_pairs, d):
    """(t, h, w, e) for the multi-stream modes: one of the first three > 0,
    sum <= D; they may repeat over, or cut, the pairs."""
    while True:
        hi = max(1, n_pairs // 2 if rng.random() < 0.7 else n_pairs)
        sec = [int(rng.integers(0, hi + 1)) for _ in range(3)]
        sec.append(int(rng.integers(0, 3)) if rng.random() < 0.3 else 0)
        if mode == ggml.VISION and rng.random() < 0.6:  # [y, x] covering the pairs
            y = int(rng.integers(0, n_pairs + 1))
            sec = [y, n_pairs - y, 0, 0]
        if any(sec[:3]) and sum(sec) <= d:
            return tuple(sec)


def ggml_params(rng):
    return dict(n_ctx_orig=int(pick(rng, [0, 256, 4096, 32768, 100000])),
                freq_base=float(pick(rng, [10.0, 100.0, 10000.0, 500000.0, 1e6])),
                freq_scale=float(pick(rng, [1.0, 1.0, 0.5, 0.25, 0.125, 0.1])),
                ext_factor=float(pick(rng, [0.0, 0.0, 0.5, 1.0])),
                attn_factor=float(pick(rng, [1.0, 1.0, 0.9, 1.3])),
                beta_fast=float(pick(rng, [32.0, 24.0, 1.0])),
                beta_slow=float(pick(rng, [1.0, 2.0, 32.0])))


def gen_ggml(rng):
    """cuprope.ggml.rope (every mode, forward and rope_back) against
    test_ggml.py's transcription of ggml's C loop."""
    dtype, be, npdt = draw_dtype(rng)
    mode = int(pick(rng, [ggml.NORMAL, ggml.NEOX, ggml.MROPE, ggml.VISION, ggml.IMROPE]))
    d = int(pick(rng, GGML_DIMS))
    if mode == ggml.VISION and d % 4:
        d += 2
    n_dims = d // 2 if mode == ggml.VISION else draw_rotary(rng, d)
    n_pairs = n_dims if mode == ggml.VISION else n_dims // 2
    multi = bool(mode & ggml.MROPE)
    sections = ggml_sections(rng, mode, n_pairs, d) if multi else (0, 0, 0, 0)
    params = dict(ggml_params(rng), n_dims=n_dims, mode=mode, sections=sections)
    three_d = rng.random() < 0.2
    b = 1 if three_d else int(pick(rng, [1, 2, 3]))
    s, n = int(pick(rng, [1, 2, 3, 5, 8, 13])), int(pick(rng, [1, 2, 3, 4]))
    shape = (s, n, d) if three_d else (b, s, n, d)
    top = int(pick(rng, [3000, 2 ** 17, 2 ** 20, 2 ** 24]))
    low = -100 if rng.random() < 0.2 else 0
    pos = rng.integers(low, top, 4 * s if multi else s).astype(np.int32)
    ff = None
    if rng.random() < 0.4:
        ff = rng.uniform(0.5, 4.0, n_pairs + int(rng.integers(0, 4))).astype(np.float32)
    forward = rng.random() < 0.55
    op = draw_operands(rng, npdt, "thd", ["x"], [shape], forms=["new", "out", "inplace"])
    pos_buf = make_buf(rng, np.dtype(np.int32), [("pos", pos.shape, pos, False)], plain_p=0.6)
    bufs = op.bufs + [pos_buf]
    ff_dev = ff is not None and rng.random() < 0.5  # else a host array
    if ff_dev:
        bufs.append(make_buf(rng, np.dtype(np.float32), [("ff", ff.shape, ff, False)]))
    warm, stream_kw = finish_call(rng, be)

    def invoke(a):
        fa = a["ff"] if "ff" in a else ff
        return ggml.rope(a["x"], a["pos"], fa, forward=forward, **params,
                         **output_kwargs(op.form, ["x"], a), **stream_kw)

    def want(x):
        return (c_rope(x[None], pos, ff, forward=forward, **params)[0] if three_d
                else c_rope(x, pos, ff, forward=forward, **params))

    mscale = c_mscale(params["attn_factor"], params["freq_scale"], params["ext_factor"])
    expects = op.expects(want, ulp_rule(float(np.abs(op.x64[0]).max()), dtype, mscale),
                         n_dims if mode != ggml.VISION and n_dims < d else None)
    pdesc = ", ".join(f"{k}={v}" for k, v in params.items() if k not in ("n_dims", "mode"))
    desc = (f"{be.name} {dtype} ggml.rope {ggml.MODES[mode]} {'fwd' if forward else 'back'} "
            f"src{list(shape)} n_dims={n_dims} {pdesc} pos<{top}"
            f"{'' if ff is None else f' ff[{ff.size}]' + ('@x' if ff_dev else '')} "
            f"{op.desc}{' warm' if warm else ''}{' stream=' if stream_kw else ''}")
    return Case("ggml", desc, be, bufs, invoke, expects, warm,
                {"dtype": dtype, "mode": ggml.MODES[mode], "form": op.form, "backend": be.name})


# --------------------------------------------------------------------------- LRPE

LRPE_DIMS = [2, 4, 6, 8, 16, 32, 48, 64, 64, 80, 96, 128, 128, 160, 192, 256]
THETA_KINDS = ["H,E", "H,P", "1,E", "E", "H", "H,1", "1,1"]


def draw_theta(rng, h, d):
    """θ of one of the documented shapes (never the ambiguous 1-D one)."""
    p = d // 2
    e = int(rng.integers(1, p + 1))
    kind = pick(rng, THETA_KINDS)
    shape = {"H,E": (h, e), "H,P": (h, p), "1,E": (1, e), "E": (e,), "H": (h,), "H,1": (h, 1),
             "1,1": (1, 1)}[kind]
    if len(shape) == 1 and shape[0] == h == p and h > 1:
        shape = (h, 1) if kind == "H" else (1, p)
    if rng.random() < 0.7:
        theta = rng.uniform(0.01, 1.0, shape)
    else:
        theta = 10000.0 ** -rng.uniform(0.0, 1.0, shape)
    if rng.random() < 0.15:
        theta = theta.astype(np.float32)
    return theta, f"theta{list(shape)}:{kind}"


def lrpe_offset(rng, n):
    r = rng.random()
    if r < 0.4:
        return 0
    if r < 0.7:
        return int(rng.integers(1, 1000))
    if r < 0.9:
        return 10 ** 6 + int(rng.integers(0, 1000))
    return POS_MAX - (n - 1) - int(rng.integers(0, 1000))


def gen_lrpe(rng):
    """cuprope.lrpe.rotate_1d_forward/backward: every act × dim × θ shape, offsets."""
    dtype, be, npdt = draw_dtype(rng)
    three_d = rng.random() < 0.15
    d = int(pick(rng, LRPE_DIMS))
    h = 1 if three_d else int(pick(rng, [1, 2, 3, 4, 5, 8]))
    b, n = draw_sizes(rng, [h], d, seq_lens=[1, 2, 3, 5, 9, 16, 33, 64, 128, 200], long=h > 1)
    shape = (b, n, d) if three_d else (b, n, h, d)
    act, dim = pick(rng, ACT_DIMS)
    if act != "softmax" and rng.random() < 0.3:
        dim = pick(rng, [-1, 1])  # ignored by the elementwise activations
    theta, tdesc = draw_theta(rng, h, d)
    theta_dev = rng.random() < 0.2
    offset = lrpe_offset(rng, n)
    backward = rng.random() < 0.5
    x64 = exact_values(rng, shape, mag=3)
    do64 = exact_values(rng, shape, mag=3) if backward else None
    x_none = backward and act == "none" and rng.random() < 0.3
    names = (["do"] if x_none else ["x", "do"]) if backward else ["x"]
    forms = ["new", "new", "out", "out=main"] + (["out=x"] if backward and not x_none else [])
    form = pick(rng, forms)
    target = {"out": "out_main", "out=main": names[-1], "out=x": "x"}.get(form)
    values = {"x": x64, "do": do64}
    # x and dO may share a buffer, side by side along H (along N for [B, N, D])
    in_bufs, in_desc = place_inputs(rng, npdt, names, [shape] * len(names),
                                    [values[m] for m in names], False, "thd" if three_d else "bshd",
                                    fuse_p=0.25, extra_max=2)
    for buf in in_bufs:  # the input an out= points at may be written
        for v in buf.views:
            if v.name == target:
                v.written = True
                buf.written[v.idx] = True
    out_bufs = []
    if form == "out":
        out_bufs = [make_buf(rng, npdt, [("out_main", shape, None, True)], margin=True)]
    if theta_dev:
        in_bufs.append(make_buf(rng, theta.dtype, [("theta", theta.shape, theta, False)],
                                plain_p=1.0))
    warm, _ = finish_call(rng, be)

    def invoke(a):
        th = a["theta"] if "theta" in a else theta
        kw = dict(offset=offset, act=act, dim=dim)
        if target is not None:
            kw["out"] = a[target]
        if backward:
            return lrpe.rotate_1d_backward(None if x_none else a["x"], a["do"], th, **kw)
        return lrpe.rotate_1d_forward(a["x"], th, **kw)

    th2 = lrpe.normalize_theta(theta, h, d)

    def canon(v):
        return None if v is None else (v[:, :, None, :] if three_d else v)

    s_max = float(np.abs(lrpe.activation(canon(x64), act, dim)).max())
    if backward:
        ref = lrpe.backward_reference(canon(x64), canon(do64), th2, offset, act, dim)
        scale = float(np.abs(do64).max()) * act_grad_bound(act, s_max)
    else:
        ref = lrpe.forward_reference(canon(x64), th2, offset, act, dim)
        scale = s_max
    ref = ref[:, :, 0, :] if three_d else ref

    def rule(got, want):
        lrpe_check(got, want, scale, dtype, act, "lrpe")

    expects = [Expect(names[-1], ref, rule, names[-1], target)]
    desc = (f"{be.name} {dtype} lrpe.rotate_1d_{'backward' if backward else 'forward'} "
            f"x{list(shape)} act={act} dim={dim} {tdesc}{'@x' if theta_dev else ''} "
            f"offset={offset}{' x=None' if x_none else ''} in:{in_desc} form={form}"
            f"{' out:' + str(out_bufs[0].placement) if out_bufs else ''}{' warm' if warm else ''}")
    return Case("lrpe", desc, be, in_bufs + out_bufs, invoke, expects, warm,
                {"dtype": dtype, "act": f"{act}/{dim}", "form": form, "backend": be.name})


# --------------------------------------------------------------------------- families

GENERATORS = {"core": gen_core, "schemes": gen_schemes, "tables": gen_tables, "ggml": gen_ggml,
              "lrpe": gen_lrpe}
# Case i belongs to CYCLE[i % 20]: 7 core, 4 schemes, 3 tables, 2 ggml, 4 lrpe in 20.
CYCLE = ("core", "schemes", "lrpe", "core", "tables", "core", "ggml", "schemes", "lrpe", "core",
         "tables", "core", "schemes", "lrpe", "core", "tables", "ggml", "schemes", "lrpe", "core")
FAMILIES = tuple(GENERATORS)


def family_of(i):
    return CYCLE[i % len(CYCLE)]


def make_case(seed, i):
    rng = np.random.default_rng([seed, i])
    return GENERATORS[family_of(i)](rng)
