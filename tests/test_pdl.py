"""Programmatic dependent launch (``enable_pdl``) on the host, no GPU needed:
the launch attribute's layout, plans that launch with it through a stand-in
driver (from the first call on, never through CuPy), the errors where no
such launch can be made, the flag carried by every decode op's LaunchSpec
and kept apart in the fast paths' keys, the custom ops' schemas, and the
NumPy backend taking the flag. The GPU side (same bits with and without,
under CUDA-graph capture behind a GEMM) is tests/test_gpu_pdl.py."""
import ctypes

import numpy as np
import pytest

import cuprope
from cuprope._core import driver, fastpath, launcher, loader
from cuprope.rope import args
from cuprope.rope import decode, launch
from cuprope.rope import fast as rope_fast
from cuprope.rope import kernels as rope_kernels

torch = pytest.importorskip("torch", reason="needs torch: pip install torch")
import cuprope.torch  # noqa: E402 (after the skip: needs torch)

HQ, HK, D = 4, 2, 64


def test_launch_attribute_is_cudas_layout():
    """CUlaunchAttribute: id (uint32) padded to 8 bytes, then a 64-byte value
    union whose int programmaticStreamSerializationAllowed sits at byte 8."""
    la = driver.LaunchAttribute
    assert ctypes.sizeof(la) == 72
    assert (la.id.offset, la.value.offset) == (0, 8)
    assert driver.PROGRAMMATIC_STREAM_SERIALIZATION == 6


class FakeFunc:
    """A kernel stand-in: records CuPy-style launches (none expected for PDL)."""
    ptr = 4321

    def __init__(self):
        self.calls = []

    def __call__(self, grid, block, params, shared_mem, stream):
        self.calls.append(stream.ptr)


class FakeDriver:
    """cuLaunchKernelEx stand-in: records (stream, function, grid, attributes)."""

    def __init__(self, rc=0):
        self.seen, self.rc = [], rc

    def __call__(self, cfg_ref, func, params, extra):
        cfg = ctypes.cast(ctypes.addressof(cfg_ref._obj), ctypes.POINTER(driver.LaunchConfig))[0]
        attrs = ctypes.cast(cfg.attrs, ctypes.POINTER(driver.LaunchAttribute))
        self.seen.append((cfg.stream, func.value, list(cfg.grid),
                          [(attrs[i].id, attrs[i].value) for i in range(cfg.n_attrs)]))
        return self.rc


def _driver(monkeypatch, rc=0, ex=True, ok=True, arch=90):
    fake = FakeDriver(rc)
    monkeypatch.setattr(driver.DRIVER, "_ok", ok)
    monkeypatch.setattr(driver.DRIVER, "_ex", ex)
    monkeypatch.setattr(driver.DRIVER, "_fn", fake)
    monkeypatch.setattr(driver.DRIVER, "ptx_version", lambda ptr: arch)
    monkeypatch.setattr(driver.DRIVER, "error_name", lambda rc: f"CUDA_ERROR_{rc}")
    return fake


def _spec(pdl, calls=launch.ROPE_CALLS):
    return launcher.LaunchSpec("k", "f", (3, 1, 1), (128, 1, 1), 0,
                               [(args.ROPE_ARGS, args.pack_args(rot_dim=64))], calls, pdl=pdl)


def test_a_pdl_plan_launches_through_the_driver_with_the_attribute_from_its_first_call(
        monkeypatch):
    """The first launch of a pdl plan already goes through cuLaunchKernelEx
    with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 1 (CuPy's
    launch takes no attributes: a first call under capture would lose it),
    and so does every later one; a plain plan launches through CuPy first,
    then through the driver with no attribute."""
    fake = _driver(monkeypatch)
    fn = FakeFunc()
    pl = launcher.Plan(0, fn, _spec(True))
    pl.run(77, 1, 2, 3, 4, 5, 6, 0)
    pl.run(77, 1, 2, 3, 4, 5, 6, 0)
    pl.run(78, 1, 2, 3, 4, 5, 6, 0)
    assert fn.calls == []
    assert [s[0] for s in fake.seen] == [77, 77, 78]
    assert all(s[1:] == (4321, [3, 1, 1], [(6, 1)]) for s in fake.seen)
    assert pl.bound.attributes() == ((6, 1),)
    plain = launcher.Plan(0, fn, _spec(False))
    plain.run(77, 1, 2, 3, 4, 5, 6, 0)
    plain.run(77, 1, 2, 3, 4, 5, 6, 0)
    assert fn.calls == [77] and fake.seen[-1][3] == [] and plain.bound.attributes() == ()


@pytest.mark.parametrize("ok", [True, False])
def test_enable_pdl_without_launch_kernel_ex_raises(monkeypatch, ok):
    """A driver without cuLaunchKernelEx (before CUDA 12), or none at all:
    a clear RuntimeError, never a launch without the attribute."""
    fake = _driver(monkeypatch, ex=False, ok=ok)
    fn = FakeFunc()
    with pytest.raises(RuntimeError, match="enable_pdl needs the CUDA driver's cuLaunchKernelEx"):
        launcher.Plan(0, fn, _spec(True)).run(5, 0, 0, 0, 0, 0, 0, 0)
    assert fn.calls == [] and fake.seen == []


def test_enable_pdl_before_sm_90_raises(monkeypatch):
    """A kernel built for an architecture before sm_90 has no
    griddepcontrol.wait: launching it with the attribute could race the
    previous kernel, so it is refused (ValueError naming the architecture)."""
    fake = _driver(monkeypatch, arch=80)
    with pytest.raises(ValueError, match="compute capability 9.0 or newer.*compute_80"):
        launcher.Plan(0, FakeFunc(), _spec(True)).run(5, 0, 0, 0, 0, 0, 0, 0)
    assert fake.seen == []


def test_a_refused_pdl_launch_raises_the_drivers_error(monkeypatch):
    _driver(monkeypatch, rc=1)
    fn = FakeFunc()
    with pytest.raises(RuntimeError, match="CUDA_ERROR_1"):
        launcher.Plan(0, fn, _spec(True)).run(5, 0, 0, 0, 0, 0, 0, 0)
    assert fn.calls == []


def test_jit_lowering_refuses_a_pdl_spec():
    """jaxlib's kernel call takes no launch attributes: no silent plain launch."""
    with pytest.raises(ValueError, match="no jit lowering"):
        launcher.flat_call(_spec(True), {})
    launcher.flat_call(_spec(False), {})
    with pytest.raises(ValueError, match="pre pass"):
        launcher.LaunchSpec("k", "f", (1, 1, 1), (32, 1, 1), 0, [], pre=_spec(False), pdl=True)


# ---------------------------------------------------------------- specs


def _rope_spec(tokens, pdl, angles=True):
    plans = [launch.TensorPlan(0, 0, (h * D, h * D, D), (h * D, h * D, D), h) for h in (HQ, HK)]
    return launch.rope_spec(sms=132, dtype="bfloat16", interleaved=False, plans=plans,
                            n_batch=tokens, n_seq=1, head_dim=D, rot_dim=D, copy_rest=False,
                            pos=(0, 0, 0, 1), seq_off=None, inv_freq_ptr=1, freq_sh=0,
                            stream_map_ptr=0, scale=1.0, sin_sign=1.0,
                            angles=(lambda: (4096, 1024)) if angles else None, pdl=pdl)


@pytest.mark.parametrize("pdl", [False, True])
def test_every_decode_launch_spec_carries_the_flag(monkeypatch, pdl):
    """rope_spec (the decode rows and rope_kernel), kv_spec (rotary_embedding's
    decode rows and kv_rope_kernel) and mla_spec state enable_pdl as data, so
    eager and fast calls launch alike; nothing else changes."""
    from cuprope.kvcache import launch as kl
    from cuprope.mla import launch as ml
    monkeypatch.setattr(kl, "sm_count", lambda device: 132)
    monkeypatch.setattr(ml, "sm_count", lambda device: 132)
    few, many = _rope_spec(1, pdl), _rope_spec(decode.MAX_TOKENS + 1, pdl)
    assert few.family == "decode" and "rope_kernel" in many.kernel
    assert few.pdl is pdl and many.pdl is pdl
    plain = _rope_spec(1, not pdl)
    assert (plain.kernel, plain.grid, plain.params) == (few.kernel, few.grid, few.params)
    rope = dict(in_ptr=(0, 0), out_ptr=(0, 0), in_ss=(HQ * D, HK * D), in_sh=(D, D),
                out_ss=(HQ * D, HK * D), out_sh=(D, D), heads=(HQ, HK), n_batch=1, n_seq=8,
                head_dim=D, rot_dim=D, pos_ptr=0, pos_is64=1, pos_ss=1, scale=1.0, sin_sign=1.0)
    cs = kl.kv_spec(0, dtype="bfloat16", interleaved=False, vec=8,
                    src=rope_kernels.KV_COS_SIN_F32,
                    fp8=0, rope=rope, kv=dict(cs_ptr=512, cs_st=D, cs_rows=64), pdl=pdl)
    app = kl.kv_spec(0, dtype="bfloat16", interleaved=False, vec=8, src=rope_kernels.KV_ANGLES,
                     fp8=3, rope=rope, kv=dict(k_cache=64, v_cache=64, v_ptr=64), pdl=pdl)
    assert cs.family == "decode" and "kv_rope_kernel" in app.kernel
    assert cs.pdl is pdl and app.pdl is pdl
    mla = ml.mla_spec(0, dtype="bfloat16", interleaved=True, vec=8, fp8=0,
                      rope=dict(heads=(16, 1), n_seq=4, rot_dim=64), kv={},
                      mla=dict(ckv_dim=512), pdl=pdl)
    assert mla.pdl is pdl


# ---------------------------------------------------------------- fast-path keys


class Payload:
    def __init__(self, device=0):
        self.device, self.align, self.runs = device, 16, []

    def run(self, stream, *ptrs):
        self.runs.append(stream)


def _cpu_fast(monkeypatch):
    """Let CPU torch tensors into the fast paths (a registered plan is then run)."""
    fw = fastpath.Adapter(fastpath.torch_collector(-1), torch.Tensor.data_ptr, torch.empty_like,
                          lambda dev: 1000 + dev, lambda: 0)
    monkeypatch.setitem(fastpath.ADAPTERS, "torch", fw)
    return fw


@pytest.mark.parametrize("registered", [False, True])
def test_rope_fast_path_never_mixes_plans_with_and_without_pdl(monkeypatch, registered):
    """A plan registered for enable_pdl=X serves only calls with X: the other
    setting takes the general path (here the NumPy backend)."""
    fw = _cpu_fast(monkeypatch)
    cfg = cuprope.RopeConfig(D)
    q, k = torch.randn(1, 1, HQ, D), torch.randn(1, 1, HK, D)
    pos = torch.tensor([5])
    tkt = rope_fast.rope_ticket(fw, (q, k), False, pos, None, None, True, registered)
    plan = Payload()
    fastpath.remember(cfg._launches.fast, tkt, [None] * 4, plan)
    cuprope.rope_qk_forward(q, k, cfg, positions=pos, inplace=True, enable_pdl=not registered)
    assert plan.runs == []
    cuprope.rope_qk_forward(q, k, cfg, positions=pos, inplace=True, enable_pdl=registered)
    assert plan.runs == [1000]


def test_kv_and_cos_sin_fast_paths_key_on_the_flag(monkeypatch):
    """rope_append_kv and rotary_embedding: a plan registered without
    enable_pdl is not taken by a call with it, and is by a call without."""
    from cuprope import kvcache
    from cuprope.kvcache import rotary
    fw = _cpu_fast(monkeypatch)
    t = 3
    q, k, v = torch.randn(t, HQ, D), torch.randn(t, HK, D), torch.randn(t, HK, D)
    pos, slots = torch.arange(t), torch.arange(t)
    kc, vc = torch.zeros(2, 4, HK, D), torch.zeros(2, 4, HK, D)
    cfg = cuprope.RopeConfig(D, layout="thd")
    arrays = (q, k, v, pos, kc, vc, None, slots) + (None,) * 9
    plan = Payload()
    fastpath.remember(cfg._launches.fast, fastpath.ticket(
        fw, ("kv", fastpath.get_ident(), "NHD", False), arrays), [None] * 17, plan)
    kw = dict(k_cache=kc, v_cache=vc, slot_mapping=slots)
    kvcache.rope_append_kv(q, k, v, cfg, pos, enable_pdl=True, **kw)
    assert plan.runs == [] and kc.any()
    kvcache.rope_append_kv(q, k, v, cfg, pos, enable_pdl=False, **kw)
    assert plan.runs == [1000]

    table = torch.randn(8, D)
    plan = Payload()
    monkeypatch.setattr(rotary, "_LAUNCHES", cuprope.config.LaunchCache())
    header = ("cs", fastpath.get_ident(), D, True, 0, False, False)
    fastpath.remember(rotary._LAUNCHES.fast,
                      fastpath.ticket(fw, header, (pos, q, k, table)), [None] * 4, plan)
    q0 = q.clone()
    cuprope.torch.rotary_embedding(pos, q, k, D, table, True, enable_pdl=True)
    assert plan.runs == [] and not torch.equal(q, q0)
    cuprope.torch.rotary_embedding(pos, q, k, D, table, True)
    assert plan.runs == [1000]


# ---------------------------------------------------------------- the ops' flag


def _mla_args(t=3, h=2):
    rng = np.random.default_rng(1)
    q = rng.standard_normal((t, h, 64)).astype(np.float32)
    k = rng.standard_normal((t, 64)).astype(np.float32)
    c = rng.standard_normal((t, 512)).astype(np.float32)
    return q, k, c, np.arange(t, dtype=np.int64)


def _calls():
    """Each decode op on the NumPy backend, as fn(enable_pdl) -> its outputs."""
    from cuprope import kvcache, mla, prologue
    rng = np.random.default_rng(0)
    t = 3
    q = rng.standard_normal((t, HQ, D)).astype(np.float32)
    k = rng.standard_normal((t, HK, D)).astype(np.float32)
    v = rng.standard_normal((t, HK, D)).astype(np.float32)
    pos = np.array([3, 0, 9], dtype=np.int64)
    cfg = cuprope.RopeConfig(D, layout="thd")
    table = torch.from_numpy(rng.standard_normal((16, D)).astype(np.float32))

    def rope_qk(pdl):
        return cuprope.rope_qk_forward(q, k, cfg, positions=pos, enable_pdl=pdl)

    def rope(pdl):
        return (cuprope.rope_forward(q, cfg, positions=pos, enable_pdl=pdl),)

    def cos_sin(pdl):
        qq, kk = torch.from_numpy(q.copy()), torch.from_numpy(k.copy())
        cuprope.torch.rotary_embedding(torch.from_numpy(pos), qq, kk, D, table, True,
                                       enable_pdl=pdl)
        return qq, kk

    def append(pdl):
        kc, vc = np.zeros((2, 4, HK, D), np.float32), np.zeros((2, 4, HK, D), np.float32)
        out = kvcache.rope_append_kv(q.copy(), k, v, cfg, pos, k_cache=kc, v_cache=vc,
                                     slot_mapping=np.arange(t), enable_pdl=pdl)
        return out, kc, vc

    def prologue_(pdl):
        kc, vc = np.zeros((2, 4, HK, D), np.float32), np.zeros((2, 4, HK, D), np.float32)
        out = prologue.qk_norm_rope_append_kv(q.copy(), k, v, cfg, pos, k_cache=kc, v_cache=vc,
                                              slot_mapping=np.arange(t), enable_pdl=pdl)
        return out, kc, vc

    def mla_(pdl):
        qp, kp, c, p = _mla_args()
        cache = np.zeros((2, 4, 576), np.float32)
        out = mla.rope_append_mla(qp, kp, c, cuprope.RopeConfig(64), p, kv_cache=cache,
                                  slot_mapping=np.arange(3), enable_pdl=pdl)
        return out, cache

    return dict(rope_qk_forward=rope_qk, rope_forward=rope, rotary_embedding=cos_sin,
                rope_append_kv=append, qk_norm_rope_append_kv=prologue_, rope_append_mla=mla_)


@pytest.mark.parametrize("op", sorted(_calls()))
def test_every_decode_op_takes_enable_pdl(op):
    """Each decode op takes ``enable_pdl``: on the NumPy backend it changes
    nothing; a value that is not a bool is a TypeError."""
    fn = _calls()[op]
    want, got = fn(False), fn(True)
    for a, b in zip(want, got):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(TypeError, match="enable_pdl must be a bool"):
        fn("yes")


def test_custom_op_schemas_carry_enable_pdl():
    """torch.compile turns these calls into custom ops: their schemas take
    enable_pdl (default False, so the earlier argument lists still bind)."""
    import cuprope.prologue.torch  # noqa: F401 (registers its op)
    for op in ("rope_qk", "rope", "rotary_embedding", "qk_norm_rope_append_kv"):
        schema = str(getattr(torch.ops.cuprope, op).default._schema)
        assert "bool enable_pdl=False" in schema, schema


def test_torch_compile_passes_enable_pdl_into_the_custom_op():
    """rope_qk_forward under torch.compile(fullgraph=True): the graph's
    cuprope::rope_qk node gets enable_pdl=True; the results are the eager
    ones (CPU tensors: the NumPy backend behind the op)."""
    cfg = cuprope.RopeConfig(D)
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 1, HQ, D, generator=g), torch.randn(2, 1, HK, D, generator=g)
    pos = torch.tensor([[4], [11]])
    seen = []

    def backend(gm, example_inputs):
        seen.extend((str(n.target), n.args) for n in gm.graph.nodes
                    if n.op == "call_function" and "cuprope" in str(n.target))
        return gm.forward

    def step(a, b, p):
        return cuprope.rope_qk_forward(a, b, cfg, positions=p, enable_pdl=True)

    got = torch.compile(step, backend=backend, fullgraph=True)(q, k, pos)
    want = cuprope.rope_qk_forward(q, k, cfg, positions=pos)
    assert all(torch.equal(x, y) for x, y in zip(got, want))
    (target, node_args), = seen
    assert "rope_qk" in target and node_args[-1] is True
