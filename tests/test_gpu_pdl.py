"""Programmatic dependent launch (``enable_pdl``) of every decode op on the
GPU (skipped with a reason where there is none; sm_90+ for the launches).

Each op reads q and k (and v) from one buffer that a torch matmul writes
right before it, as a serving engine's QKV projection does. Results with
``enable_pdl`` must equal those without bit for bit: (a) eager, (b) a CUDA
graph of [the matmul -> the op] replayed with new matmul inputs, positions
and slots, against the unfused eager matmul and op on copies (a kernel that
read q/k before waiting for the matmul would see the previous replay's
values), (c) the fast path's second call keeps the launch attribute. The
matmul's inputs are small integers over powers of two, so every algorithm
cuBLAS may pick gives the same exact sums: the graph's and the eager
matmul write the same bits.
"""
import numpy as np
import pytest

import cuprope
from conftest import GPU_TESTS
from torch_helpers import gen, host_bytes, sentinel, tdt

pytestmark = GPU_TESTS

HQ, HK, D = 32, 8, 128
K = 256          # the matmul's inner dim: entries in {-1, 0, 1} x {-1/8, 0, 1/8} sum exactly
PAGES, PS = 128, 16     # 2048 cache rows: one per token up to 1500 tokens
MLA_H, NOPE, RD, DC = 16, 512, 64, 512
DTYPES = ["bfloat16", "float16", "float32"]
DEVICE = "cuda"


def _torch():
    import torch
    return torch


def _needs_pdl():
    torch = _torch()
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs compute capability 9.0+")


def _ints(shape, dtype, g, scale=1.0):
    """Values in {-scale, 0, scale} drawn on ``g``'s device, as ``dtype``."""
    torch = _torch()
    x = torch.randint(-1, 2, shape, device=g.device, generator=g).float() * scale
    return x.to(tdt(dtype))


def _thd(rot=D, **kw):
    return cuprope.RopeConfig(rot, base=500000.0, layout="thd", **kw)


class Case:
    """One op behind a matmul: ``state`` holds the matmul's x and w, the qkv
    buffer it writes, the op's other arrays (``mutable``: those it writes),
    ``op(state, pdl)`` the call on views of ``state["qkv"]``."""

    def __init__(self, state, mutable, op):
        self.state, self.mutable, self.op = state, mutable, op

    def step(self, state, pdl):
        _torch().matmul(state["x"], state["w"], out=state["qkv"])
        self.op(state, pdl)

    def copy(self):
        """The state with its written arrays cloned (the same inputs)."""
        return {n: (a.clone() if n in self.mutable else a) for n, a in self.state.items()}

    def outputs(self, state):
        return [host_bytes(state[n].reshape(state[n].shape[0], -1)) for n in self.mutable]

    def renew(self, rng, g):
        """New matmul inputs, positions and slots, written into the same tensors."""
        torch = _torch()
        s = self.state
        s["x"].copy_(_ints(s["x"].shape, str(s["x"].dtype).replace("torch.", ""), g))
        t = s["pos"].shape[0]
        s["pos"].copy_(torch.from_numpy(rng.integers(1, 30000, t)))
        if "slots" in s:
            sl = rng.permutation(PAGES * PS)[:t]
            if t > 1:
                sl[rng.integers(0, t)] = -1             # a padding token writes no cache row
            s["slots"].copy_(torch.from_numpy(sl))


def _base(g, dtype, t, n, rng):
    torch = _torch()
    return {"x": _ints((t, K), dtype, g), "w": _ints((K, n), dtype, g, 0.125),
            "qkv": torch.empty((t, n), dtype=tdt(dtype), device=DEVICE),
            "pos": torch.from_numpy(rng.integers(1, 30000, t)).to(DEVICE)}


def _qkv_views(s, t):
    qkv = s["qkv"]
    return (qkv[:, :HQ * D].view(t, HQ, D), qkv[:, HQ * D:(HQ + HK) * D].view(t, HK, D),
            qkv[:, (HQ + HK) * D:].view(t, HK, D))


def _slots(rng, t):
    return _torch().from_numpy(rng.permutation(PAGES * PS)[:t].astype(np.int64)).to(DEVICE)


def case(name, dtype, t, seed=0):
    torch = _torch()
    g, rng = gen(seed + t, DEVICE), np.random.default_rng(seed + t)
    n = (HQ + 2 * HK) * D
    if name in ("rope_qk_forward", "rope_forward", "rotary_embedding"):
        s = _base(g, dtype, t, n, rng)
        cfg = _thd()
        if name == "rope_qk_forward":
            def op(s, pdl):
                q, k, _ = _qkv_views(s, t)
                cuprope.rope_qk_forward(q, k, cfg, positions=s["pos"], inplace=True,
                                        enable_pdl=pdl)
        elif name == "rope_forward":
            def op(s, pdl):
                cuprope.rope_forward(_qkv_views(s, t)[0], cfg, positions=s["pos"], inplace=True,
                                     enable_pdl=pdl)
        else:
            import cuprope.torch as ctorch
            from cuprope.kvcache.cos_sin_cache import build_cos_sin_cache
            s["table"] = build_cos_sin_cache(cfg, 30000, like=s["qkv"])

            def op(s, pdl):
                qkv = s["qkv"]
                ctorch.rotary_embedding(s["pos"], qkv[:, :HQ * D], qkv[:, HQ * D:(HQ + HK) * D],
                                        D, s["table"], True, enable_pdl=pdl)
        return Case(s, ("qkv",), op)
    if name in ("rope_append_kv", "rope_append_kv_fp8", "qk_norm_rope_append_kv",
                "qk_norm_rope_append_kv_fp8"):
        fp8 = name.endswith("fp8")
        s = _base(g, dtype, t, n, rng)
        s["slots"] = _slots(rng, t)
        cdt = "fp8" if fp8 else dtype
        s["kv"] = sentinel((PAGES, 2, PS, HK, D), cdt, g)
        scales = {}
        if fp8:
            s["ks"] = torch.tensor(0.07, device=DEVICE)
            s["vs"] = torch.tensor([0.11], device=DEVICE)
        cfg = _thd()
        if name.startswith("rope_append_kv"):
            from cuprope import kvcache

            def op(s, pdl):
                q, k, v = _qkv_views(s, t)
                if fp8:
                    scales.update(k_scale=s["ks"], v_scale=s["vs"])
                kvcache.rope_append_kv(q, k, v, cfg, s["pos"], kv_cache=s["kv"],
                                       slot_mapping=s["slots"], enable_pdl=pdl, **scales)
        else:
            from cuprope.prologue import qk_norm_rope_append_kv
            s["qw"], s["kw"] = (_ints((D,), dtype, g, 0.5) + 1 for _ in range(2))

            def op(s, pdl):
                q, k, v = _qkv_views(s, t)
                if fp8:
                    scales.update(k_scale=s["ks"], v_scale=s["vs"])
                qk_norm_rope_append_kv(q, k, v, cfg, s["pos"], q_weight=s["qw"],
                                       k_weight=s["kw"], kv_cache=s["kv"],
                                       slot_mapping=s["slots"], enable_pdl=pdl, **scales)
        return Case(s, ("qkv", "kv"), op)
    if name in ("rope_append_mla", "rope_append_mla_fp8"):
        from cuprope.mla import rope_append_mla
        fp8 = name.endswith("fp8")
        n = MLA_H * (NOPE + RD) + DC + RD
        s = _base(g, dtype, t, n, rng)
        s["slots"] = _slots(rng, t)
        cdt = "fp8" if fp8 else dtype
        s["cache"] = sentinel((PAGES, PS, DC + RD), cdt, g)
        s["q_out"] = sentinel((t, MLA_H, NOPE + RD), cdt, g)
        if fp8:
            s["qs"], s["cs"] = (torch.tensor(v, device=DEVICE) for v in (0.05, 0.03))
        cfg = cuprope.RopeConfig(RD, interleaved=True, layout="thd")

        def op(s, pdl):
            qkv, q_out = s["qkv"], s["q_out"]
            q_nope = qkv[:, :MLA_H * NOPE].view(t, MLA_H, NOPE)
            q_pe = qkv[:, MLA_H * NOPE:MLA_H * (NOPE + RD)].view(t, MLA_H, RD)
            ckv = qkv[:, MLA_H * (NOPE + RD):MLA_H * (NOPE + RD) + DC]
            k_pe = qkv[:, MLA_H * (NOPE + RD) + DC:]
            kw = dict(q_scale=s["qs"], kv_scale=s["cs"]) if fp8 else {}
            rope_append_mla(q_pe, k_pe, ckv, cfg, s["pos"], kv_cache=s["cache"],
                            slot_mapping=s["slots"], q_nope=q_nope,
                            q_nope_out=q_out[..., :NOPE], q_pe_out=q_out[..., NOPE:],
                            enable_pdl=pdl, **kw)
        return Case(s, ("q_out", "cache"), op)
    raise KeyError(name)


OPS = ["rope_qk_forward", "rope_forward", "rotary_embedding", "rope_append_kv",
       "rope_append_kv_fp8", "qk_norm_rope_append_kv", "qk_norm_rope_append_kv_fp8",
       "rope_append_mla", "rope_append_mla_fp8"]


@pytest.mark.parametrize("t", [1, 64, 1500])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", OPS)
def test_eager_results_equal_with_and_without_pdl(name, dtype, t):
    """(a) The matmul, then the op with enable_pdl, eagerly: the bytes of the
    same with a plain launch (decode rows at 1 and 64 tokens, the general
    kernels at 1500)."""
    _needs_pdl()
    c = case(name, dtype, t)
    plain, pdl = c.copy(), c.copy()
    c.step(plain, False)
    c.step(pdl, True)
    _torch().cuda.synchronize()
    for a, b in zip(c.outputs(plain), c.outputs(pdl)):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("t", [1, 64])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", OPS)
def test_graph_of_a_matmul_then_the_op_replays_the_unfused_eager_bits(name, dtype, t):
    """(b) A CUDA graph of [matmul writing qkv -> op with enable_pdl],
    replayed with new matmul inputs, positions and slots: every replay's
    outputs (qkv in place, q_out, the cache) equal the eager matmul and
    plain op on copies of the state."""
    _needs_pdl()
    torch = _torch()
    c = case(name, dtype, t, seed=7)
    c.step(c.state, True)                      # warm-up: compile, tables, plans
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c.step(c.state, True)
    rng, g = np.random.default_rng(11), gen(13, DEVICE)
    for it in range(4):
        c.renew(rng, g)
        want = c.copy()
        c.step(want, False)
        raw = torch.matmul(c.state["x"], c.state["w"])
        graph.replay()
        torch.cuda.synchronize()
        for a, b in zip(c.outputs(c.state), c.outputs(want)):
            assert np.array_equal(a, b), (name, it)
        if "qkv" in c.mutable:   # it did rotate what this replay's matmul wrote
            assert not np.array_equal(host_bytes(c.state["qkv"]), host_bytes(raw))


def _plans():
    """Every launcher.Plan the decode ops' caches hold (fast-path entries,
    plans by call signature, the prologue's and MLA's plan caches)."""
    import gc

    from cuprope._core import launcher
    return {id(p): p for p in gc.get_objects() if isinstance(p, launcher.Plan)}


@pytest.mark.parametrize("name", OPS)
def test_the_second_call_keeps_the_launch_attribute(name):
    """(c) The first call plans the launch with the programmatic-serialization
    attribute; the second (the fast path where the op has one) launches the
    same plan, still with it; plain calls' plans carry none."""
    _needs_pdl()
    torch = _torch()
    import cuprope.kvcache.rotary as rotary
    for pdl in (True, False):
        # rotary_embedding's plans live in one module-level cache (the others'
        # in the case's new config): the first pass's would serve the second
        rotary._LAUNCHES.clear()
        c = case(name, "bfloat16", 8, seed=3 + pdl)
        c.step(c.state, not pdl)                 # compiles, builds the tables (their plans)
        before = _plans()
        c.step(c.state, pdl)
        made = {i: p for i, p in _plans().items() if i not in before}
        c.step(c.state, pdl)
        torch.cuda.synchronize()
        assert set(_plans()) - set(before) == set(made)      # the second call made none
        assert made, name
        for p in made.values():
            assert p.pdl is pdl and p.bound is not None
            assert p.bound.attributes() == (((6, 1),) if pdl else ())
