"""Host cost of each step of the torch fast path, on the CPU (no GPU needed;
benchmarks/NOTES.md 36). Run: PYTHONPATH=. python benchmarks/probes/host_steps_cpu.py

CPU torch tensors stand in for CUDA ones (the key collector takes
min_device=-1), the current device and stream are stubs, and the driver's
launch entry points are no-op C functions of their signatures (compiled
here with ``cc``: what is timed is ctypes' argument conversion and call). "before"
rows time the steps as commit 3ff220f made them (transcribed below: the
nested key, pointers read twice, NumPy slot writes, ``cuLaunchKernel``
through argtypes with eleven arguments); "after" rows are the code as it is.
"""
import ctypes
import os
import subprocess
import tempfile
import threading
import timeit

import numpy as np
import torch

import cuprope
from cuprope._core import driver, fastpath, launcher
from cuprope.rope import args
from cuprope.rope import fast as rope_fast, launch

N = 20000


def ns(fn, n=N):
    return min(timeit.repeat(fn, number=n, repeat=7)) / n * 1e9


def noop_lib():
    """A shared library with cuLaunchKernel's and cuLaunchKernelEx's
    signatures, doing nothing and returning 0 (CUDA_SUCCESS)."""
    d = tempfile.mkdtemp()
    src, lib = os.path.join(d, "noop.c"), os.path.join(d, "libnoop.so")
    with open(src, "w") as f:
        f.write("int launch(void*f,unsigned a,unsigned b,unsigned c,unsigned d,unsigned e,"
                "unsigned g,unsigned s,void*st,void**p,void**x){return 0;}\n"
                "int launch_ex(const void*cfg,void*f,void**p,void**x){return 0;}\n")
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", lib, src], check=True)
    return lib


def main():
    cfg = cuprope.RopeConfig(128)
    q = torch.randn(1, 1, 32, 128, dtype=torch.bfloat16)
    k = torch.randn(1, 1, 8, 128, dtype=torch.bfloat16)
    pos = torch.tensor([1000], dtype=torch.int32)
    lib = noop_lib()
    u, vp = ctypes.c_uint, ctypes.c_void_p

    # ---- before (3ff220f)
    def old_part(t):
        return (t.dtype, t.shape, t.stride(), t.device, t.data_ptr() % 16)

    def old_key():
        parts = [threading.get_ident(), False, True]
        for x in (q, k):
            if type(x).__module__ != "torch" or not x.is_cuda + 1:  # is_cuda read, CPU let in
                raise RuntimeError
            parts.append(old_part(x))
        parts.append(k.data_ptr() - q.data_ptr())
        parts.append((pos.dtype, pos.shape, pos.stride(), pos.device, pos.data_ptr() % 16))
        parts.append(None)
        return tuple(parts)

    okey = old_key()
    old_plans = {okey: (None, None)}
    buf = np.frombuffer(bytearray(args.ARGS.size), dtype=np.int64)
    old_fn = ctypes.CDLL(lib).launch
    old_fn.argtypes = [vp, u, u, u, u, u, u, u, vp, vp, vp]
    old_fn.restype = ctypes.c_int
    params = (vp * 1)(buf.ctypes.data)
    paddr = ctypes.addressof(params)

    def old_writes():
        seven_writes(buf)

    def old_launch():
        return old_fn(140000000000, 3, 1, 1, 320, 1, 1, 0, 0, paddr, None) == 0

    class OldPlan:  # LaunchPlan.run -> _launch -> Driver.launch, as in 3ff220f
        device, grid, block, smem, _params = 0, (3, 1, 1), (320, 1, 1), 0, (None, paddr, 1 << 40)

        def run(self, stream_ptr, in0, in1, out0, out1, pos_ptr, seq_ptr, offset):
            old_writes()
            self._launch(stream_ptr)

        def _launch(self, stream_ptr):
            if self._params is None or not old_driver_launch(self, stream_ptr):
                raise RuntimeError

    def old_driver_launch(plan, stream_ptr):
        _, params, func = plan._params
        g, b = plan.grid, plan.block
        return old_fn(func, g[0], g[1], g[2], b[0], b[1], b[2], plan.smem, stream_ptr, params,
                      None) == 0

    old_plan = OldPlan()
    old_plans[okey] = (old_plan, None)
    stub_device, stub_stream = (lambda: 0), (lambda dev: 0)

    def old_total():  # fastpath.fast_path of 3ff220f, in place, CPU tensors let in
        if type(0) is not int:
            return None
        key = old_key()
        plan, spans = old_plans.get(key)
        if stub_device() != plan.device:
            return None
        in0, in1 = q.data_ptr(), k.data_ptr()
        res = (q, k)
        out0, out1 = q.data_ptr(), k.data_ptr()
        if (out0 | out1) % 16:
            return None
        plan.run(stub_stream(0), in0, in1, out0, out1, pos.data_ptr(), 0, 0)
        return tuple(res)

    # ---- after (this tree): a registered plan, a CPU adapter, libc's labs as the driver
    fw = fastpath.Adapter(fastpath.torch_collector(-1), torch.Tensor.data_ptr, torch.empty_like,
                          lambda dev: 0, lambda: 0)
    fastpath.ADAPTERS["torch"] = fw
    plan = launcher.Plan(0, None, launcher.LaunchSpec(
        "k", "f", (3, 1, 1), (320, 1, 1), 0, [(args.ROPE_ARGS, args.pack_args())],
        launch.ROPE_CALLS, vec=8, align=16))
    cfgc = driver.LaunchConfig((u * 3)(3, 1, 1), (u * 3)(320, 1, 1), 0, None, None, 0)
    new_fn = ctypes.CDLL(lib).launch_ex
    new_fn.restype = ctypes.c_int
    plan.bound = driver.Bound(new_fn, (ctypes.byref(cfgc), vp(140000000000), vp(paddr), None),
                              cfgc, -1, None)
    tkt = rope_fast.fast_key("torch", (q, k), cfg, False, pos, None, None, True, None)
    fastpath.remember(cfg._launches.fast, tkt, [fastpath.span(fastpath_info(x)) for x in (q, k)], plan)
    key, ptrs, _ = tkt

    rows = [
        ("threading.get_ident()", lambda: threading.get_ident(), None),
        ("one signature: old (dtype, shape, stride(), device, ptr % 16)",
         lambda: old_part(q), None),
        ("one signature: new key += (dtype, shape, stride(), get_device(), ptr & 15)",
         None, lambda: fw.collect((q,), [], [])),
        ("x.device / x.get_device()", lambda: q.device, lambda: q.get_device()),
        ("x.data_ptr()", lambda: q.data_ptr(), None),
        ("key of q, k, positions (old: nested, + k - q; new: flat ticket)", old_key,
         lambda: rope_fast.rope_ticket(fw, (q, k), False, pos, None, None, True)),
        ("dict lookup of that key (old: nested tuple; new: lookup + device stub)",
         lambda: old_plans.get(okey),
         lambda: fastpath.lookup(cfg._launches.fast, key, ptrs, fw.current_device)),
        ("7 per-call fields (old: NumPy item writes; new: memoryview)", old_writes,
         lambda: seven_writes(plan.words)),
        ("driver call (old: cuLaunchKernel, argtypes, 11 args; new: Ex, 4 ready args)",
         old_launch, lambda: plan.bound.launch(0)),
        ("whole fast path (old: transcribed; new: rope.fast.fast_path)", old_total,
         lambda: rope_fast.fast_path((q, k), cfg, False, pos, 0, None, None, True, None)),
        ("the public call, rope_qk_forward(q, k, cfg, positions=pos, inplace=True)", None,
         lambda: cuprope.rope_qk_forward(q, k, cfg, positions=pos, inplace=True)),
    ]
    print(f"{'step':<84} {'before ns':>9} {'after ns':>9}")
    for name, before, after in rows:
        b = f"{ns(before):9.0f}" if before else f"{'':>9}"
        a = f"{ns(after):9.0f}" if after else f"{'':>9}"
        print(f"{name:<84} {b} {a}")
    for name, fn in (("torch.empty_like(q) (not in the in-place call)", lambda: torch.empty_like(q)),
                     ("q.mul_(1.0) (CPU eager op, for scale)", lambda: q.mul_(1.0))):
        print(f"{name:<84} {'':>9} {ns(fn):9.0f}")


def fastpath_info(x):
    from cuprope._core.arrays import describe
    return describe(x, "x")


def seven_writes(b):
    """The 7 per-call fields of RopeArgs, into a NumPy array or a memoryview."""
    b[0] = 1
    b[1] = 2
    b[2] = 3
    b[3] = 4
    b[30] = 5
    b[35] = 6
    b[37] = 7


if __name__ == "__main__":
    main()
