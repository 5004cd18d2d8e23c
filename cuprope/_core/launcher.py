"""The one launcher: every op states its launch as data (:class:`LaunchSpec`),
and this module plans it on a device (:func:`plan`), caches it
(:func:`cached_plan`, in the owner's ``cuprope.config.LaunchCache``), runs it
through the CUDA driver on the caller's stream (``Plan.run``, which the fast
paths replay too) and lowers it under ``jax.jit`` (:func:`flat_call`), all
from the same spec: eager, fast and jit calls launch the same kernel body
with the same grid, shared memory and argument words.
"""
from __future__ import annotations

import ctypes
import dataclasses

import numpy as np

from .driver import DRIVER, Stream
from .loader import MODULES


class LaunchSpec:
    """One launch as data: ``kernel`` (a name expression of ``family``, as its
    kernel record lists it), ``grid``, ``block``, ``smem`` (dynamic shared bytes),
    ``params`` ((ArgStruct, bytes) per parameter group, in order), ``calls``
    ((buffer slot, value index, addend) per word written per call), ``flat``
    (the name expression of the kernel's flat entry for the jit lowering;
    None: the kernel's parameters are flat already), ``pre`` (a LaunchSpec
    run first with the same words, or None), ``vec`` (the pack width the
    pointers' alignment allowed), ``align`` (vec times the item size: the
    byte alignment the fast paths check new outputs against) and ``pdl``
    (a programmatic dependent launch: the kernel may start before the
    stream's previous kernel ends, and waits for it where it reads what that
    kernel may have written; ``enable_pdl`` of the decode ops).

    A ``params`` group is a struct passed by value (one kernel parameter) or
    a spread list of 8-byte scalars (one parameter each;
    ``cuprope._core.args``)."""

    __slots__ = ("kernel", "family", "grid", "block", "smem", "params", "calls", "flat", "pre",
                 "vec", "align", "pdl")

    def __init__(self, kernel, family, grid, block, smem, params, calls=(), *, flat=None,
                 pre=None, vec=1, align=1, pdl=False):
        self.kernel, self.family = kernel, family
        self.grid, self.block, self.smem = tuple(grid), tuple(block), int(smem)
        self.params = tuple(params)
        self.calls = tuple(c if isinstance(c[0], int) else (self.slot(c[0]), c[1], c[2])
                           for c in calls)
        self.flat, self.pre, self.vec, self.align = flat, pre, vec, align
        if pdl and pre is not None:
            raise ValueError("a launch with a pre pass takes no programmatic dependent launch")
        self.pdl = bool(pdl)

    def slot(self, role, group=None) -> int:
        """The buffer slot (int64 word) of a field role (``in_ptr1``,
        ``v_cache``) of parameter group ``group`` (default: the first group
        with that field)."""
        base = 0
        for i, (st, raw) in enumerate(self.params):
            name = role if role in st.slots else role[:-1]
            if (group is None and name in st.slots) or group == i:
                return base + st.slot(role)
            base += len(raw) // 8
        raise KeyError(f"no launch field {role!r}")

# ---------------------------------------------------------------- eager (driver)

_PLAN_CLASSES: dict = {}


def _plan_class(calls, has_pre):
    """The Plan subclass for one set of per-call words, whose ``run`` takes
    the call's values as positional parameters, writes them out (no loop, no
    subscript on the hot path) and makes the driver call inline
    (Plan.launch does the rest: the first launch through CuPy, a changed
    stream, a driver error). Values past those the calls use are accepted
    and ignored."""
    key = (calls, has_pre)
    cls = _PLAN_CLASSES.get(key)
    if cls is None:
        names = [f"v{i}" for i in range(1 + max((i for _, i, _ in calls), default=-1))]
        sig = ", ".join(["self", "stream_ptr"] + names + ["*rest"])
        lines = [f"def run({sig}):"]
        if has_pre:
            lines.append(f"    self.pre.run({', '.join(['stream_ptr'] + names)})")
        lines.append("    w = self.words")
        lines += [f"    w[{s}] = v{i}" + (f" + {a}" if a else "") for s, i, a in calls]
        lines += ["    d = self.bound",
                  "    if d is None or d.stream != stream_ptr or d.call(*d.args):",
                  "        self.launch(stream_ptr)"]
        ns: dict = {}
        exec("\n".join(lines), ns)  # noqa: S102 - source built above from integers only
        cls = _PLAN_CLASSES[key] = type("Plan", (Plan,), {"__slots__": (), "run": ns["run"]})
    return cls


class Plan:
    """A LaunchSpec planned on ``device``: the kernel function, the packed
    parameters in one buffer (``words``: its int64 view), launched through
    CuPy the first time and through the CUDA driver after that
    (driver.Bound; a driver error falls back to CuPy, which raises clearly).
    ``run(stream_ptr, *values)`` writes the spec's per-call words from
    ``values`` and launches. A plan belongs to one thread (its buffer is
    reused; the driver copies kernel arguments at launch). A ``pdl`` plan
    launches through the driver from the first call on (CuPy's launch takes
    no attributes), and a driver error raises there."""

    __slots__ = ("device", "func", "grid", "block", "smem", "words", "align", "pre", "_raw",
                 "_groups", "_addrs", "bound", "pdl")

    def __new__(cls, device, func, spec, pre=None):
        return object.__new__(_plan_class(spec.calls, pre is not None))

    def __init__(self, device, func, spec, pre=None):
        self.device, self.func = device, func
        self.grid, self.block, self.smem = spec.grid, spec.block, spec.smem
        self.align, self.pre, self.pdl = spec.align, pre, spec.pdl
        raw = bytearray(b"".join(bytes(b) for _, b in spec.params))  # each plan owns its buffer
        self._raw = raw
        self.words = memoryview(raw).cast("q")
        base = ctypes.addressof((ctypes.c_char * len(raw)).from_buffer(raw))
        groups, addrs, off = [], [], 0
        for st, b in spec.params:
            if st.spread:
                groups.append((off // 8, st.n_words, None))
                addrs += [base + off + 8 * i for i in range(st.n_words)]
            else:
                view = np.frombuffer(raw, dtype=np.uint8, count=len(b), offset=off).view(st.dtype)
                groups.append((off // 8, 0, view))
                addrs.append(base + off)
            off += len(b)
        self._groups, self._addrs = tuple(groups), tuple(addrs)
        self.bound = None

    def _cupy_args(self):
        out = []
        for start, n, view in self._groups:
            if view is not None:
                out.append(view)
            else:
                out += [np.int64(self.words[start + i]) for i in range(n)]
        return tuple(out)

    def _func_ptr(self) -> int:
        func = self.func
        ptr = getattr(func, "ptr", None)
        if ptr is None:  # a cupy RawKernel: its Function for the current device
            ptr = func.kernel.ptr
        return int(ptr)

    def launch(self, stream_ptr):
        """Through the driver once this has launched once through CuPy."""
        if self.pdl:
            self._launch_pdl(stream_ptr)
            return
        b = self.bound
        if b is None or not b.launch(stream_ptr):
            self.bound = None
            self.func(self.grid, self.block, self._cupy_args(), shared_mem=self.smem,
                      stream=Stream(stream_ptr))
            self.bound = DRIVER.bind(self._func_ptr(), self.grid, self.block, self.smem,
                                     self._addrs, self._raw)

    def _launch_pdl(self, stream_ptr):
        """A programmatic dependent launch through the driver (bound on the
        first call): RuntimeError where the driver cannot make one or
        refuses it, ValueError for a kernel built for an architecture before
        sm_90 (it has no griddepcontrol.wait)."""
        b = self.bound
        if b is None:
            ptr = self._func_ptr()
            b = DRIVER.bind(ptr, self.grid, self.block, self.smem, self._addrs, self._raw,
                            pdl=True)
            arch = DRIVER.ptx_version(ptr)
            if arch < 90:
                built = (f"this kernel was built for compute_{arch}" if arch else
                         "the driver reports no architecture for this kernel")
                raise ValueError(f"enable_pdl needs a GPU of compute capability 9.0 or newer "
                                 f"(programmatic dependent launch); {built}: call without "
                                 f"enable_pdl")
            self.bound = b
        rc = b.launch_rc(stream_ptr)
        if rc:
            raise RuntimeError(f"cuLaunchKernelEx refused the programmatic dependent launch of "
                               f"{getattr(self.func, 'name', 'a cuprope kernel')}: "
                               f"{DRIVER.error_name(rc)}")


def plan(spec, device) -> Plan:
    """``spec`` planned on ``device`` (its ``pre`` pass too)."""
    pre = None if spec.pre is None else plan(spec.pre, device)
    return Plan(device, MODULES.functions(device, spec.family)[spec.kernel], spec, pre)


def on_device(device, fn, *args):
    """``fn(*args)`` with ``device`` current (a launch goes to the current device)."""
    import cupy
    if cupy.cuda.runtime.getDevice() != device:
        with cupy.cuda.Device(device):
            fn(*args)
    else:
        fn(*args)


def cached_plan(cache, key, spec_of, device):
    """The Plan that ``cache`` (a ``cuprope.config.LaunchCache``) holds under
    ``key``, else ``plan(spec_of(), device)``, cached there."""
    p = cache.plans.get(key)
    if p is None:
        p = cache.plans[key] = plan(spec_of(), device)
    return p


# ---------------------------------------------------------------- jit (flat entry)

@dataclasses.dataclass(frozen=True)
class FlatCall:
    """A LaunchSpec as one flat kernel call (jaxlib's GPU kernel call):
    ``name`` (the flat entry's name expression), ``family`` (the kernel
    family whose translation unit holds it), ``grid``, ``warps`` per block,
    ``smem``, ``params`` (("array", align) or ("scalar", value, kind) in
    the entry's parameter order), ``operands`` (what each array
    parameter that is not a result reads, in order: ("operand", i),
    ("constant", host table) or ("part",), an earlier call's scratch result)
    and ``results`` ((shape, dtype) in order)."""

    name: str
    family: str
    grid: tuple
    warps: int
    smem: int
    params: tuple
    operands: tuple
    results: tuple = ()


def flat_call(spec, sources, align=None, fixed=None, results=()) -> FlatCall:
    """``spec`` as one flat kernel call: its flat entry (or the kernel itself
    when its parameters are spread scalars), one parameter per word of its
    (single) parameter group in the entry's order. ``sources`` maps a
    pointer role to what XLA passes there (an operand reference, see
    FlatCall, or ``"out"``: the next result); unnamed pointers are 0.
    ``align``: a role's required alignment in bytes (default 0); ``fixed``:
    words the eager path writes per call (``offset``), by field, fixed here."""
    if spec.pdl:
        raise ValueError("a programmatic dependent launch (enable_pdl) has no jit lowering: "
                         "jaxlib's kernel call takes no launch attributes")
    (st, raw), = spec.params
    words = np.frombuffer(raw, dtype=np.int64).copy()
    for role, value in (fixed or {}).items():
        words[st.slot(role)] = value
    if st.spread:
        order = range(st.n_words)
        roles = {st.slot(r): r for r in sources}
    else:
        order = st.pointer_slots + st.flat_words
        roles = dict(zip(st.pointer_slots, st.pointers))
    align = align or {}
    params, refs = [], []
    for slot in order:
        role = roles.get(slot)
        if role is None:
            params.append(("scalar", int(words[slot]), "i64"))
            continue
        src = sources.get(role)
        if src is None:
            params.append(("scalar", 0, "u64"))
            continue
        params.append(("array", int(align.get(role, 0))))
        if not isinstance(src, str):
            refs.append(src)
    return FlatCall(spec.flat or spec.kernel, spec.family, spec.grid,
                    spec.block[0] * spec.block[1] // 32, spec.smem, tuple(params), tuple(refs),
                    tuple(results))
