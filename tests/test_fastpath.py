"""The fast paths' host machinery without a GPU (cuprope/_core/fastpath.py,
launcher.Plan, driver.LaunchConfig): signature keys of torch tensors
(CPU tensors let in with min_device=-1), overlap windows and their variants,
the lookup, and pointer patching of packed argument structs."""
import ctypes
import struct

import numpy as np
import pytest

from cuprope._core import driver, fastpath, launcher
from cuprope.rope import args
from cuprope.rope import fast as rope_fast, launch
from cuprope.qknorm import kernels as qknorm_kernels

torch = pytest.importorskip("torch", reason="needs torch: pip install torch")


def collect(arrays, header=("h",), min_device=-1):
    key, ptrs = list(header), []
    fastpath.torch_collector(min_device)(arrays, key, ptrs)
    return tuple(key), ptrs


def test_key_holds_each_signature_and_none_for_absent_arrays():
    q = torch.zeros(2, 1, 4, 8, dtype=torch.bfloat16)
    pos = torch.arange(2, dtype=torch.int32)
    key, ptrs = collect((q, None, pos))
    assert ptrs == [q.data_ptr(), 0, pos.data_ptr()]
    assert key == ("h", torch.bfloat16, q.shape, q.stride(), -1, q.data_ptr() & 15, None,
                   torch.int32, pos.shape, pos.stride(), -1, pos.data_ptr() & 15)
    hash(key)


def test_key_changes_with_every_property_of_a_signature():
    base = torch.zeros(4, 3, 16)
    key0 = collect((base,))[0]
    wide = torch.zeros(4, 3, 32)
    variants = {
        "shape": torch.zeros(4, 2, 16),
        "dtype": torch.zeros(4, 3, 16, dtype=torch.float16),
        "strides": wide[:, :, :16],                               # same shape, other strides
        "non-contiguous view": base.transpose(0, 1).contiguous().transpose(0, 1),
        "alignment": torch.zeros(4 * 3 * 16 + 1)[1:].view(4, 3, 16),
    }
    for what, t in variants.items():
        assert collect((t,))[0] != key0, what
    assert collect((base.view(4, 3, 16),))[0] == key0                # another view, same layout
    int32 = collect((base, torch.zeros(4, dtype=torch.int32)))[0]
    int64 = collect((base, torch.zeros(4, dtype=torch.int64)))[0]
    assert int32 != int64
    assert collect((base, None))[0] != collect((base, torch.zeros(())))[0]


def test_collector_refuses_what_it_cannot_key():
    t = torch.zeros(3, 8)
    for bad in (np.zeros((3, 8), np.float32), torch.nn.Parameter(torch.zeros(3, 8)), [1, 2]):
        with pytest.raises(fastpath.NoFastPath):
            collect((t, bad))
    with pytest.raises(fastpath.NoFastPath):
        collect((t,), min_device=0)               # a host tensor where a GPU is needed
    assert fastpath.ticket(None, ("h",), (t,)) is None
    fw = fastpath.Adapter(fastpath.torch_collector(0), *[None] * 4)
    assert fastpath.ticket(fw, ("h",), (t,)) is None


class Payload:
    def __init__(self, device=0):
        self.device, self.runs = device, []

    def run(self, stream, *ptrs):
        self.runs.append((stream, list(ptrs)))


def _fw(device=0):
    return fastpath.Adapter(fastpath.torch_collector(-1), torch.Tensor.data_ptr, torch.empty_like,
                            lambda dev: 1000 + dev, lambda: device)


def test_guard_windows_keep_overlapping_pointers_to_the_variant_validated():
    """Arrays 0 and 1 of one buffer: adjacent (no overlap) is the plain
    variant; an overlap only hits a launch registered with that exact
    difference."""
    buf = torch.zeros(64)
    a, b = buf[:32], buf[32:]
    fw = _fw()
    plans = {}
    tkt = fastpath.ticket(fw, ("t",), (a, b), ((0, 1),))
    spans = [(0, 128), (0, 128)]
    clean = Payload()
    fastpath.remember(plans, tkt, spans, clean)
    entry = plans[tkt.key]
    assert entry.guards == ((0, 1, -128, 128),)
    assert list(entry.variants) == [(None,)]       # 128 bytes apart: outside the window
    # other buffers, same layout and difference: the same launch
    buf2 = torch.zeros(64)
    assert fastpath.fast_call(plans, fw, ("t",), (buf2[:32], buf2[32:]))
    assert clean.runs[-1] == (1000, [buf2.data_ptr(), buf2.data_ptr() + 128])
    # far apart: still outside the window
    assert fastpath.fast_call(plans, fw, ("t",), (torch.zeros(32), torch.zeros(32)))
    # overlapping by 16 elements: not validated, so the general path runs
    big = torch.zeros(48)
    assert not fastpath.fast_call(plans, fw, ("t",), (big[:32], big[16:]))
    over = Payload()
    fastpath.remember(plans, fastpath.ticket(fw, ("t",), (big[:32], big[16:]), ((0, 1),)), spans,
                      over)
    assert (64,) in entry.variants
    big2 = torch.zeros(48)
    assert fastpath.fast_call(plans, fw, ("t",), (big2[:32], big2[16:]))
    assert over.runs and len(clean.runs) == 2
    # the same view twice (difference 0) is yet another variant
    assert not fastpath.fast_call(plans, fw, ("t",), (big2[:32], big2[:32]))


def test_entry_variant_is_each_guards_difference_inside_its_open_window():
    """The compiled variant of several guards: per guard, ptrs[j] - ptrs[i]
    where lo < difference < hi, else None; no guard gives ()."""
    guards = ((0, 1, -128, 128), (2, 0, -64, 32), (1, 2, 0, 1))
    e = fastpath.Entry(guards)
    rng = np.random.default_rng(3)
    cases = [[0, 0, 0], [1000, 1127, 1000], [1000, 1128, 1000], [0, -127, 40], [5, 5, 4],
             [5, 6, 6], [2 ** 47, 2 ** 47 + 64, 2 ** 47 - 31]] + [
        list(rng.integers(0, 300, 3)) for _ in range(50)]
    for ptrs in cases:
        want = tuple(ptrs[j] - ptrs[i] if lo < ptrs[j] - ptrs[i] < hi else None
                     for i, j, lo, hi in guards)
        assert e.variant(ptrs) == want, ptrs
    assert fastpath.Entry(()).variant([7]) == ()
    assert fastpath.Entry(guards[:1]).variant([0, 127]) == (127,)


def test_lookup_misses_on_another_key_or_another_current_device():
    fw = _fw(device=0)
    x = torch.zeros(8)
    plans = {}
    p = Payload(device=0)
    fastpath.remember(plans, fastpath.ticket(fw, ("t", 1), (x,)), [None], p)
    assert fastpath.fast_call(plans, fw, ("t", 1), (torch.zeros(8),))
    assert not fastpath.fast_call(plans, fw, ("t", 2), (torch.zeros(8),))    # settings
    assert not fastpath.fast_call(plans, fw, ("t", 1), (torch.zeros(9),))    # shape
    assert not fastpath.fast_call(plans, fw, ("t", 1), (None,))
    assert not fastpath.fast_call(plans, _fw(device=1), ("t", 1), (torch.zeros(8),))
    assert not fastpath.fast_call(plans, None, ("t", 1), (torch.zeros(8),))
    assert not fastpath.fast_call({}, fw, ("t", 1), (torch.zeros(8),))
    assert len(p.runs) == 1


def test_core_ticket_pairs_follow_outputs_and_in_place():
    fw = _fw()
    q, k = torch.zeros(1, 1, 4, 8), torch.zeros(1, 1, 2, 8)
    oq, ok = torch.zeros_like(q), torch.zeros_like(k)
    key, ptrs, pairs = rope_fast.rope_ticket(fw, (q, k), False, None, None, None, True)
    assert pairs == ((0, 1),) and ptrs[-2:] == [0, 0]
    _, _, pairs = rope_fast.rope_ticket(fw, (q, k), False, None, None, None, False)
    assert pairs == ()
    key2, ptrs, pairs = rope_fast.rope_ticket(fw, (q, k), False, None, None, (oq, ok), False)
    assert pairs == ((0, 2), (0, 3), (1, 2), (1, 3), (2, 3))
    assert ptrs[2:4] == [oq.data_ptr(), ok.data_ptr()] and key2 != key


class FakeFunc:
    """A kernel stand-in: records the bytes of each argument at launch."""
    ptr = 0

    def __init__(self):
        self.calls = []

    def __call__(self, grid, block, params, shared_mem, stream):
        self.calls.append((grid, block, [bytes(p.tobytes()) for p in params], shared_mem,
                           stream.ptr))


def test_plan_run_writes_per_call_words_into_both_structs(monkeypatch):
    """Plan.run writes values[i] + addend into RopeArgs and KvArgs words (the
    spec's calls, fields of either struct by name) and leaves every other
    field as packed."""
    monkeypatch.setattr(driver.DRIVER, "_ok", False)   # no driver: every launch through func
    ra = args.pack_args(heads=(32, 8), head_dim=128, scale=0.5)
    ka = args.pack_kv_args(page_size=16, num_pages=7)
    calls = [("in_ptr0", 0, 0), ("in_ptr1", 1, 0), ("pos_ptr", 2, 0), ("k_cache", 3, 0),
             ("v_cache", 3, 4096), ("k_scale", 4, 0)]
    fn = FakeFunc()
    spec = launcher.LaunchSpec("k", "f", (3, 1, 1), (128, 1, 1), 512,
                               [(args.ROPE_ARGS, ra), (args.KV_ARGS, ka)], calls)
    pl = launcher.Plan(0, fn, spec)
    for call, ptrs in enumerate(([11, 22, 33, 44000, 55], [1, 2, 3, 4, 0])):
        pl.run(77 + call, *ptrs)
        grid, block, (rb, kb), smem, stream = fn.calls[-1]
        assert (grid, block, smem, stream) == ((3, 1, 1), (128, 1, 1), 512, 77 + call)
        r = dict(zip([f"{n}{i}" for n, c, _ in args.ARGS_FIELDS for i in range(c)],
                     struct.unpack(args.ARGS.format, rb)))
        k = dict(zip([n for n, _, _ in args.KV_ARGS.fields], struct.unpack(
            args.KV_ARGS.packer.format, kb)))
        assert (r["in_ptr0"], r["in_ptr1"], r["pos_ptr0"]) == tuple(ptrs[:3])
        assert (k["k_cache"], k["v_cache"], k["k_scale"]) == (ptrs[3], ptrs[3] + 4096, ptrs[4])
        assert (r["heads0"], r["heads1"], r["head_dim0"], r["scale0"]) == (32, 8, 128, 0.5)
        assert (k["page_size"], k["num_pages"], r["out_ptr0"], k["slot_ptr"]) == (16, 7, 0, 0)
    assert len(fn.calls) == 2 and pl.bound is None


def test_spec_slots_name_fields_of_every_group():
    kv0 = args.ROPE_ARGS.n_words
    spec = launcher.LaunchSpec("k", "f", (1, 1, 1), (32, 1, 1), 0,
                               [(args.ROPE_ARGS, args.pack_args()),
                                (args.KV_ARGS, args.pack_kv_args())])
    assert spec.slot("in_ptr1") == args.ARGS_SLOTS["in_ptr"] + 1
    assert spec.slot("pos_ptr") == args.ARGS_SLOTS["pos_ptr"]
    assert spec.slot("v_ptr") == kv0
    assert spec.slot("write_rest") == kv0 + len(args.KV_ARGS.fields) - 1
    with pytest.raises(KeyError):
        spec.slot("nothing")


def test_spread_parameters_launch_one_scalar_per_word(monkeypatch):
    """A spread parameter list (qknorm_dw_kernel's) goes to the kernel as
    one int64 per word, after a by-value struct where there is one."""
    monkeypatch.setattr(driver.DRIVER, "_ok", False)
    fn = FakeFunc()
    raw = qknorm_kernels.DW_ARGS.pack(part_ptr=5, rows=6, stride=7, col0=8, cols=9, out_ptr=10,
                            out_dtype=2)
    spec = launcher.LaunchSpec("k", "f", (1, 1, 1), (256, 1, 1), 0, [(qknorm_kernels.DW_ARGS, raw)])
    launcher.Plan(0, fn, spec).run(3)
    assert [struct.unpack("<q", b)[0] for b in fn.calls[-1][2]] == [5, 6, 7, 8, 9, 10, 2]


def test_rope_plan_run_writes_its_per_call_fields(monkeypatch):
    monkeypatch.setattr(driver.DRIVER, "_ok", False)
    spec = launcher.LaunchSpec("k", "f", (1, 1, 1), (32, 1, 1), 0,
                               [(args.ROPE_ARGS, args.pack_args(rot_dim=64))], launch.ROPE_CALLS)
    plan = launcher.Plan(0, FakeFunc(), spec)
    plan.run(5, 1, 2, 3, 4, 6, 7, -9)
    w = plan.words
    slots = [args.ROPE_ARGS.slot(r) for r in ("in_ptr0", "in_ptr1", "out_ptr0", "out_ptr1",
                                              "pos_ptr", "seq_off_ptr", "offset")]
    assert [w[s] for s in slots] == [1, 2, 3, 4, 6, 7, -9]
    assert w[args.ARGS_SLOTS["rot_dim"]] == 64


def test_launch_config_is_cudas_layout():
    """CUlaunchConfig: gridDimX..Z, blockDimX..Z, sharedMemBytes (uint32),
    hStream at 32, attrs at 40, numAttrs at 48; 56 bytes."""
    lc = driver.LaunchConfig
    assert ctypes.sizeof(lc) == 56
    assert (lc.grid.offset, lc.block.offset, lc.smem.offset) == (0, 12, 24)
    assert (lc.stream.offset, lc.attrs.offset, lc.n_attrs.offset) == (32, 40, 48)


def test_bound_launch_patches_the_stream_only_when_it_changes():
    """A Bound call with a recording stand-in for the driver entry point."""
    seen = []

    def call(cfg_ref, func, params, extra):
        cfg = ctypes.cast(ctypes.addressof(cfg_ref._obj), ctypes.POINTER(driver.LaunchConfig))[0]
        seen.append((cfg.stream, func.value, params.value, extra, list(cfg.grid), cfg.smem))
        return 0

    cfg = driver.LaunchConfig((ctypes.c_uint * 3)(4, 2, 1), (ctypes.c_uint * 3)(64, 1, 1), 96,
                              None, None, 0)
    b = driver.Bound(call, (ctypes.byref(cfg), ctypes.c_void_p(1234), ctypes.c_void_p(5678),
                            None), cfg, -1, None)
    assert b.launch(0) and b.launch(99) and b.launch(99)
    assert [s[0] for s in seen] == [None, 99, 99]
    assert seen[0][1:] == (1234, 5678, None, [4, 2, 1], 96)


def test_qknorm_fast_forward_runs_the_registered_plan_with_the_call_values(monkeypatch):
    """cuprope.qknorm's forward fast path (CPU tensors let in by a CPU
    adapter): a registered plan runs with (q, k, out q, out k, weights,
    positions, seq_offsets, offset) as its values, in place or into fresh
    outputs, and a call with other settings or shapes is not taken."""
    import cuprope
    from cuprope import qknorm
    fw = fastpath.Adapter(fastpath.torch_collector(-1), torch.Tensor.data_ptr, torch.empty_like,
                          lambda dev: 1000 + dev, lambda: 0)
    monkeypatch.setitem(fastpath.ADAPTERS, "torch", fw)
    cfg = cuprope.RopeConfig(64)
    q, k = torch.randn(1, 1, 4, 64), torch.randn(1, 1, 2, 64)
    w, pos = torch.randn(64), torch.tensor([[7]], dtype=torch.int32)
    settings = (1e-6, "rms", 0.0, "norm_then_rope", "head", "exact", None, pos, None)
    for inplace in (True, False):
        header, arrays = qknorm.fast_signature(q, k, w, None, *settings, inplace)
        tkt = fastpath.ticket(fw, header, arrays)
        plan = Payload()
        plan.align = 16
        cfg._launches.fast.clear()
        fastpath.remember(cfg._launches.fast, tkt, [None] * 6, plan)
        res = qknorm.rope_qk_norm_forward(q, k, cfg, q_weight=w, positions=pos, offset=5,
                                          inplace=inplace)
        (stream, values), = plan.runs
        outs = (q.data_ptr(), k.data_ptr()) if inplace else (res[0].data_ptr(),
                                                             res[1].data_ptr())
        assert stream == 1000 and values == [q.data_ptr(), k.data_ptr(), *outs, w.data_ptr(),
                                             0, pos.data_ptr(), 0, 5]
        assert (res[0] is q) == inplace and res[0].shape == q.shape
    # another eps, or a k with another head count: the general path (the host backend here)
    res = qknorm.rope_qk_norm_forward(q, k, cfg, q_weight=w, positions=pos, eps=1e-5)
    assert len(plan.runs) == 1 and not torch.equal(res[0], q)


def test_qknorm_fast_backward_runs_its_registered_launches_with_the_call_values(monkeypatch):
    """cuprope.qknorm's backward fast path (CPU tensors let in by a CPU
    adapter): the registered BackwardLaunch runs the kernel's plan with
    (grad_q, grad_k, dq, dk, weights, positions, seq_offsets, offset, q, k,
    workspace) and each weight's reduction with (its new gradient, the
    workspace); a weight left out gets None; other settings are not taken."""
    import cuprope
    from cuprope import qknorm
    from cuprope.qknorm import fast as qfast
    from cuprope.qknorm import launch as qlaunch
    fw = _fw()
    monkeypatch.setitem(fastpath.ADAPTERS, "torch", fw)
    ws = type("Ws", (), {"data": type("D", (), {"ptr": 4242})()})()
    asked = []
    monkeypatch.setattr(qlaunch, "workspace", lambda dev, st, n: asked.append((dev, st, n)) or ws)
    cfg = cuprope.RopeConfig(64)
    q, k = torch.randn(1, 1, 4, 64), torch.randn(1, 1, 2, 64)
    gq, gk = torch.randn_like(q), torch.randn_like(k)
    w, pos = torch.randn(64), torch.tensor([[7]], dtype=torch.int32)
    header, arrays = qknorm.fast_signature(q, k, w, None, 1e-6, "rms", 0.0, "norm_then_rope",
                                           "head", "exact", None, pos, None, False)
    header, arrays = ("qknb",) + header[1:], arrays[:2] + (gq, gk) + arrays[2:]
    rows, dw = Payload(), Payload()
    rows.align = 16
    fastpath.remember(cfg._launches.fast, fastpath.ticket(fw, header, arrays), (),
                      qfast.BackwardLaunch(rows, [(0, dw)], 640))
    dq, dk, dwq, dwk = qknorm.rope_qk_norm_backward(q, k, gq, gk, cfg, q_weight=w, positions=pos,
                                                    offset=5)
    (stream, values), = rows.runs
    assert stream == 1000 and asked == [(0, 1000, 640)]
    assert values == [gq.data_ptr(), gk.data_ptr(), dq.data_ptr(), dk.data_ptr(), w.data_ptr(),
                      0, pos.data_ptr(), 0, 5, q.data_ptr(), k.data_ptr(), 4242]
    assert dw.runs == [(1000, [dwq.data_ptr(), 4242])] and dwk is None
    assert dq.shape == gq.shape and dwq.shape == w.shape and dwq.dtype == w.dtype
    # another eps: the general path (the host backend here), nothing replayed
    qknorm.rope_qk_norm_backward(q, k, gq, gk, cfg, q_weight=w, positions=pos, eps=1e-5)
    assert len(rows.runs) == 1


@pytest.mark.parametrize("act,backward", [("none", False), ("none", True), ("silu", False),
                                          ("silu", True), ("softmax", False)])
def test_lrpe_launch_writes_its_call_values(monkeypatch, act, backward):
    """cuprope.lrpe's GPU launch (the device stubbed: a recording kernel, no
    driver): for every activation, both directions, the plan's per-call
    words are x (or dO) in both input slots, the output in both output
    slots, x of the fused backward, and the offset; a second call reuses the
    cached plan with the new values."""
    from cuprope import RopeConfig
    from cuprope.lrpe import api as lrpe
    from cuprope._core import launcher as launcher_mod
    from cuprope._core.arrays import describe
    monkeypatch.setattr(driver.DRIVER, "_ok", False)
    fn = FakeFunc()

    class Modules:
        def functions(self, device, family):
            return {n: fn for n in __import__("cuprope")._core.loader.all_kernel_names(family)}
    monkeypatch.setattr(launcher_mod, "MODULES", Modules())
    monkeypatch.setattr(lrpe, "sm_count", lambda device: 132)
    monkeypatch.setattr(lrpe.engine, "stream_handle", lambda stream, info: 55)
    monkeypatch.setattr(lrpe.engine, "hand_back", lambda i, o, s: [o[0].obj])
    monkeypatch.setattr(lrpe, "on_device", lambda device, f, *a: f(*a))

    class Table:
        class data:
            ptr = 4096
    monkeypatch.setattr(RopeConfig, "device_tables", lambda self, device: (Table, None))
    cfg = RopeConfig(64, inv_freq=np.full(32, 0.1))
    st = args.ROPE_ARGS
    for offset in (3, 9):
        x, do, out = (np.zeros((2, 4, 3, 64), np.float32) for _ in range(3))
        main, xi, oi = describe(do if backward else x, "x"), describe(x, "x"), describe(out, "o")
        lrpe._gpu_backend_fused(backward, main, xi, oi, cfg, offset, act, None, (2, 4, 3, 64))
        w = struct.unpack("<" + "q" * st.n_words, fn.calls[-1][2][0])
        assert w[st.slot("in_ptr0")] == w[st.slot("in_ptr1")] == main.ptr
        assert w[st.slot("out_ptr0")] == w[st.slot("out_ptr1")] == oi.ptr
        assert w[st.slot("aux_ptr")] == (xi.ptr if backward and act != "none" else 0)
        assert w[st.slot("offset")] == offset and fn.calls[-1][4] == 55
    assert len(cfg._launches.plans) == 1 and len(fn.calls) == 2
