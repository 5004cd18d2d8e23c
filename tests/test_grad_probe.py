"""Every public entry point, probed with torch tensors that require grad (CPU
tensors: the NumPy backend).

With grad mode on, a call whose tensor argument requires grad either returns
a result whose gradient is right (checked against central differences of the
call itself), or raises -- TypeError naming what to use instead, RuntimeError
for a leaf written in place, as torch's own in-place ops -- and writes
nothing. Never a result silently detached, never a leaf overwritten. Under
``torch.no_grad()`` and ``torch.inference_mode()`` the call runs as on plain
tensors. NumPy references return NumPy arrays (or raise).

``PROBES`` maps every public callable to how it is probed; a public name
missing from it (or from ``NOT_OPS``) fails ``test_every_public_callable_is_probed``,
and so does a new top-level module missing from ``MODULES``.
"""
import importlib
import importlib.util
import pkgutil
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the probe needs torch: pip install torch")
import cuprope  # noqa: E402
from cuprope import ggml, lrpe, mla, prologue, qknorm, tables  # noqa: E402
from cuprope import cos_sin_cache as csc  # noqa: E402
from cuprope import kvcache  # noqa: E402
from cuprope import torch as ctorch  # noqa: E402
from cuprope.prologue import torch as ptorch  # noqa: E402
from cuprope.qknorm import torch as qtorch  # noqa: E402

# Top-level modules and the namespaces the top level re-exports: probed (their
# __all__, and an op package's torch adapter module's), or why not.
MODULES = {
    "cuprope": None, "ggml": None, "tables": None, "cos_sin_cache": None, "qknorm": None,
    "kvcache": None, "lrpe": None, "mla": None, "prologue": None, "torch": None,
    "rope": None,  # no __all__; its torch adapter module is probed
    "scaling": "frequency tables from numbers and HF configs (no tensor math)",
    "schemes": "exported as cuprope.scaling",
    "positions": "integer positions",
    "config": "RopeConfig, probed as cuprope.RopeConfig",
    "reference": "float64 NumPy references of the rotation",
    "jax": "JAX arrays: no torch autograd",
    "cli": "the command line's verbs", "__main__": "the command line",
    "_core": "internal",
    "kernels": "the CUDA sources an installed package carries (no Python API)",
    "hfpatch": "patches transformers' attention; the patched layers call cuprope.torch's "
               "differentiable ops (gradients checked in test_hf_patch.py)",
}

# Public callables that are not ops on tensors autograd could follow.
NOT_OPS = {
    "torch.patch_hf": "patches a model's attention (no tensor in or out); the patched layers' "
                      "gradients are checked against transformers in test_hf_patch.py",
    "torch.unpatch_hf": "undoes patch_hf",
    "cuprope.default_inv_freq": "numbers in, a NumPy table out",
    "cuprope.gpu_available": "no arguments",
    "ggml.rope_config": "builds a RopeConfig (its freq_factors: probed through ggml.rope)",
    "ggml.yarn_corr_dims": "numbers in and out", "ggml.pair_streams": "numbers in and out",
    "qknorm.QkNormCall": "the unguarded call beneath the public functions, for the adapters",
    "kvcache.token_geometry": "reads an array's description",
    "kvcache.index_info": "reads an index array's description",
    "kvcache.to_host": "copies an index array to the host",
    "kvcache.np_view": "a NumPy view of a host array's description",
    "cos_sin_cache.build_cos_sin_cache": "builds a table from a RopeConfig",
}

CFG = cuprope.RopeConfig(16, base=500.0)
THD = cuprope.RopeConfig(16, base=500.0, layout="thd")
INTER = cuprope.RopeConfig(16, base=500.0, interleaved=True)


def _pos(dtype=torch.int64):
    return torch.tensor([3, 9, 1, 40, 7], dtype=dtype)


def _slots():
    return torch.tensor([5, 0, 3, 7, 2])


QK = {"q": (1, 5, 2, 16), "k": (1, 5, 1, 16)}
TAB = {"cos": (1, 5, 16), "sin": (1, 5, 16)}
W = {"q_weight": (16,), "k_weight": (16,)}
NORM_SCALARS = (CFG.key, 0, 1e-6, "rms", 0.0, "norm_then_rope", "head", "cast_then_weight")
THD_KV = {"q": (5, 2, 16), "k": (5, 1, 16), "v": (5, 1, 16), "k_cache": (2, 4, 1, 16),
          "v_cache": (2, 4, 1, 16)}
VLLM = {"qkv": (5, 64), **W, "cos_sin_cache": (64, 16)}
ROTARY = {"query": (5, 32), "key": (5, 16), "cos_sin_cache": (64, 16)}


def _prologue(fn):
    def call(t):
        return (fn(t["q"], t["k"], t["v"], THD, _pos(), q_weight=t["q_weight"],
                   k_weight=t["k_weight"], k_cache=t["k_cache"], v_cache=t["v_cache"],
                   slot_mapping=_slots()), t["k_cache"], t["v_cache"])
    return call


def _rotary(fn):
    def call(t):
        fn(_pos(), t["query"], t["key"], 16, t["cos_sin_cache"], True)
        return t["query"], t["key"]
    return call


# name -> (float tensors' shapes, the call (tensors by name -> outputs), roles).
# Roles, with the tensor requiring grad (a leaf; a non-leaf as well):
#   "grad": the outputs' gradient into it is right;
#   "type": TypeError, nothing written;
#   "leaf": written in place: RuntimeError for a leaf, TypeError for a non-leaf;
#   "inplace": written in place: RuntimeError for a leaf, the gradient for a non-leaf;
#   "host": a NumPy reference: a NumPy result, or an error.
PROBES = {
    "cuprope.rope_forward": ({"x": QK["q"]}, lambda t: cuprope.rope_forward(t["x"], CFG, offset=3),
                             {"x": "grad"}),
    "cuprope.rope_backward": ({"x": QK["q"]},
                              lambda t: cuprope.rope_backward(t["x"], CFG, positions=_pos()),
                              {"x": "grad"}),
    "cuprope.rope_qk_forward": (QK, lambda t: cuprope.rope_qk_forward(t["q"], t["k"], CFG),
                                {"q": "grad", "k": "grad"}),
    "cuprope.rope_qk_backward": (QK, lambda t: cuprope.rope_qk_backward(t["q"], t["k"], INTER),
                                 {"q": "grad", "k": "grad"}),
    "cuprope.RopeConfig": ({"inv_freq": (8,)},
                           lambda t: cuprope.RopeConfig(16, inv_freq=t["inv_freq"]).inv_freq,
                           {"inv_freq": "type"}),
    "ggml.rope": ({"x": (5, 2, 16), "ff": (8,)},
                  lambda t: ggml.rope(t["x"], _pos(torch.int32), t["ff"].abs() + 0.5, n_dims=16,
                                      mode=ggml.NEOX),
                  {"x": "grad", "ff": "type"}),
    "tables.rope_table_forward": ({"x": QK["q"], **TAB},
                                  lambda t: tables.rope_table_forward(t["x"], t["cos"], t["sin"]),
                                  {"x": "type", "cos": "type", "sin": "type"}),
    "tables.rope_table_backward": ({"x": QK["q"], **TAB},
                                   lambda t: tables.rope_table_backward(t["x"], t["cos"],
                                                                        t["sin"]),
                                   {"x": "type", "cos": "type"}),
    "tables.rope_qk_table_forward": ({**QK, **TAB},
                                     lambda t: tables.rope_qk_table_forward(
                                         t["q"], t["k"], t["cos"], t["sin"]),
                                     {"q": "grad", "k": "grad", "cos": "type", "sin": "type"}),
    "tables.rope_qk_table_backward": ({**QK, **TAB},
                                      lambda t: tables.rope_qk_table_backward(
                                          t["q"], t["k"], t["cos"], t["sin"]),
                                      {"q": "grad", "k": "grad", "sin": "type"}),
    "cos_sin_cache.rotary_embedding": (ROTARY, _rotary(csc.rotary_embedding),
                                       {"query": "leaf", "key": "leaf", "cos_sin_cache": "type"}),
    "qknorm.rope_qk_norm_forward": ({**QK, **W, **TAB},
                                    lambda t: qknorm.rope_qk_norm_forward(
                                        t["q"], t["k"], CFG, q_weight=t["q_weight"],
                                        k_weight=t["k_weight"], rounding="cast_then_weight",
                                        tables=(t["cos"], t["sin"])),
                                    {"q": "grad", "k": "grad", "q_weight": "grad",
                                     "k_weight": "grad", "cos": "type", "sin": "type"}),
    "qknorm.rope_qk_norm_backward": ({**QK, "gq": QK["q"], "gk": QK["k"], **W},
                                     lambda t: qknorm.rope_qk_norm_backward(
                                         t["q"], t["k"], t["gq"], t["gk"], CFG,
                                         q_weight=t["q_weight"], k_weight=t["k_weight"])[:3],
                                     {"q": "type", "gq": "type", "gk": "type",
                                      "q_weight": "type"}),
    "kvcache.rope_append_kv": (THD_KV,
                               lambda t: (kvcache.rope_append_kv(
                                   t["q"], t["k"], t["v"], THD, _pos(), k_cache=t["k_cache"],
                                   v_cache=t["v_cache"], slot_mapping=_slots()),
                                   t["k_cache"], t["v_cache"]),
                               {"q": "leaf", "k": "type", "v": "type", "k_cache": "leaf",
                                "v_cache": "leaf"}),
    "lrpe.rotate_1d_forward": ({"x": (1, 5, 2, 8), "theta": (2,)},
                               lambda t: lrpe.rotate_1d_forward(t["x"], t["theta"], act="relu"),
                               {"x": "type", "theta": "type"}),
    "lrpe.rotate_1d_backward": ({"x": (1, 5, 2, 8), "do": (1, 5, 2, 8)},
                                lambda t: lrpe.rotate_1d_backward(t["x"], t["do"], [0.3, 0.2],
                                                                  act="silu"),
                                {"x": "type", "do": "type"}),
    "lrpe.normalize_theta": ({"theta": (2,)}, lambda t: lrpe.normalize_theta(t["theta"], 2, 8),
                             {"theta": "type"}),
    "lrpe.activation": ({"x": (1, 5, 2, 8)}, lambda t: lrpe.activation(t["x"], "silu"),
                        {"x": "host"}),
    "lrpe.rotate": ({"x": (1, 5, 2, 8)}, lambda t: lrpe.rotate(t["x"], np.full((1, 4), 0.3)),
                    {"x": "host"}),
    "lrpe.forward_reference": ({"x": (1, 5, 2, 8)},
                               lambda t: lrpe.forward_reference(t["x"], np.full((1, 4), 0.3)),
                               {"x": "host"}),
    "lrpe.backward_reference": ({"x": (1, 5, 2, 8), "do": (1, 5, 2, 8)},
                                lambda t: lrpe.backward_reference(t["x"], t["do"],
                                                                  np.full((1, 4), 0.3)),
                                {"x": "host", "do": "host"}),
    "mla.rope_append_mla": ({"q_pe": (5, 2, 16), "k_pe": (5, 16), "ckv": (5, 8),
                             "q_nope": (5, 2, 4), "q_nope_out": (5, 2, 4), "kv_cache": (2, 4, 24)},
                            lambda t: (mla.rope_append_mla(
                                t["q_pe"], t["k_pe"], t["ckv"], INTER, _pos(),
                                kv_cache=t["kv_cache"], slot_mapping=_slots(),
                                q_nope=t["q_nope"], q_nope_out=t["q_nope_out"]),
                                t["q_nope_out"], t["kv_cache"]),
                            {"q_pe": "leaf", "k_pe": "type", "ckv": "type", "q_nope": "type",
                             "q_nope_out": "leaf", "kv_cache": "leaf"}),
    "mla.mla_reference": ({"q_pe": (5, 2, 16), "k_pe": (5, 16)},
                          lambda t: mla.mla_reference(t["q_pe"], t["k_pe"], _pos(), INTER),
                          {"q_pe": "host", "k_pe": "host"}),
    "mla.rotate_pe": ({"x": (5, 2, 16)},
                      lambda t: mla.rotate_pe(t["x"], _pos().numpy(), INTER.inv_freq),
                      {"x": "host"}),
    "prologue.qk_norm_rope_append_kv": ({**THD_KV, **W},
                                        _prologue(prologue.qk_norm_rope_append_kv),
                                        {"q": "leaf", "k": "type", "v": "type",
                                         "q_weight": "type", "k_weight": "type",
                                         "k_cache": "leaf", "v_cache": "leaf"}),
    "prologue.torch.qk_norm_rope_append_kv": ({**THD_KV, **W},
                                              _prologue(ptorch.qk_norm_rope_append_kv),
                                              {"q": "leaf", "k": "type", "v": "type",
                                               "q_weight": "type", "k_weight": "type",
                                               "k_cache": "leaf", "v_cache": "leaf"}),
    "torch.rope_qk": (QK, lambda t: ctorch.rope_qk(t["q"], t["k"], CFG, positions=_pos()[None]),
                      {"q": "grad", "k": "grad"}),
    "torch.rope": ({"x": QK["q"]}, lambda t: ctorch.rope(t["x"], INTER, offset=2),
                   {"x": "grad"}),
    "torch.rotate": (QK, lambda t: ctorch.rotate((t["q"], t["k"]), CFG, True),
                     {"q": "grad", "k": "grad"}),
    "torch.table_rotate": ({**QK, **TAB},
                           lambda t: ctorch.table_rotate(t["q"], t["k"], t["cos"], t["sin"],
                                                         "bshd", False, False),
                           {"q": "grad", "k": "grad"}),
    "torch.RopeQKFunction": (QK,
                             lambda t: ctorch.RopeQKFunction.apply(t["q"], t["k"], CFG, None, 4,
                                                                   None),
                             {"q": "grad", "k": "grad"}),
    "torch.apply_rotary_pos_emb": ({"q": (1, 2, 5, 16), "k": (1, 1, 5, 16), **TAB},
                                   lambda t: ctorch.apply_rotary_pos_emb(t["q"], t["k"], t["cos"],
                                                                         t["sin"]),
                                   {"q": "grad", "k": "grad", "cos": "grad", "sin": "grad"}),
    "torch.rotary_embedding": (ROTARY, _rotary(ctorch.rotary_embedding),
                               {"query": "leaf", "key": "leaf", "cos_sin_cache": "type"}),
    "torch.rope_qk_norm": ({**QK, **W, **TAB},
                           lambda t: ctorch.rope_qk_norm(t["q"], t["k"], CFG,
                                                         q_weight=t["q_weight"],
                                                         k_weight=t["k_weight"],
                                                         rounding="cast_then_weight",
                                                         tables=(t["cos"], t["sin"])),
                           {"q": "grad", "k": "grad", "q_weight": "grad", "k_weight": "grad",
                            "cos": "type", "sin": "type"}),
    "torch.RopeQKNormFunction": ({**QK, **TAB},
                                 lambda t: ctorch.RopeQKNormFunction.apply(
                                     t["q"], t["k"], None, None, t["cos"], t["sin"], None, None,
                                     *NORM_SCALARS),
                                 {"q": "grad", "k": "grad", "cos": "type"}),
    "torch.fused_qk_norm_rope": (VLLM,
                                 lambda t: (ctorch.fused_qk_norm_rope(
                                     t["qkv"], 2, 1, 1, 16, 1e-6, t["q_weight"], t["k_weight"],
                                     t["cos_sin_cache"], True, _pos()), t["qkv"])[1],
                                 {"qkv": "inplace", "q_weight": "grad", "k_weight": "grad",
                                  "cos_sin_cache": "type"}),
    "qknorm.torch.rope_qk_norm_backward_op": ({**QK, "gq": QK["q"], "gk": QK["k"]},
                                              lambda t: qtorch.rope_qk_norm_backward_op(
                                                  t["q"], t["k"], t["gq"], t["gk"], CFG)[:2],
                                              {"q": "type", "gk": "type"}),
}


# ---------------------------------------------------------------- coverage


def _module(m):
    """cuprope's module ``m``: the package itself, a namespace its top level
    re-exports (``cuprope.tables``), or a sub-module."""
    if m == "cuprope":
        return cuprope
    return getattr(cuprope, m, None) or importlib.import_module(f"cuprope.{m}")


def _public():
    """{probe key: the object} for every public callable: the __all__ of the
    probed top-level modules, then of their packages' torch adapter modules
    (an object reached twice counts once, under its first key)."""
    mods = [(m, _module(m)) for m, why in MODULES.items() if why is None]
    for m, mod in list(mods):
        if m != "cuprope" and hasattr(mod, "__path__") and importlib.util.find_spec(
                f"{mod.__name__}.torch"):
            mods.append((f"{m}.torch", importlib.import_module(f"{mod.__name__}.torch")))
    seen, out = set(), {}
    for key, mod in mods:
        for n in getattr(mod, "__all__", ()):
            obj = getattr(mod, n)
            if callable(obj) and id(obj) not in seen:
                seen.add(id(obj))
                out[f"{key}.{n}"] = obj
    return out


def test_every_public_callable_is_probed():
    top = {m.name for m in pkgutil.iter_modules(cuprope.__path__)} | {"cuprope"}
    assert not top - set(MODULES), f"new modules, not in MODULES: {sorted(top - set(MODULES))}"
    public = _public()
    unknown = set(public) - set(PROBES) - set(NOT_OPS)
    assert not unknown, f"public callables with no probe: {sorted(unknown)}"
    stale = (set(PROBES) | set(NOT_OPS)) - set(public)
    assert not stale, f"probes of names that are not public: {sorted(stale)}"


# ---------------------------------------------------------------- the probe


def _build(shapes, seed=0):
    g = np.random.default_rng(seed)
    return {n: torch.from_numpy(g.standard_normal(s)).float() for n, s in shapes.items()}


def _run(call, t):
    res = call(t)
    return tuple(res) if isinstance(res, (tuple, list)) else (res,)


def _cases():
    for key, (_, _, roles) in PROBES.items():
        for name, role in roles.items():
            for leaf in ((True,) if role == "host" else (True, False)):
                yield pytest.param(key, name, leaf,
                                   id=f"{key}-{name}-{'leaf' if leaf else 'nonleaf'}")


def _outcome(role, leaf):
    if role == "leaf":
        return RuntimeError if leaf else TypeError
    if role == "inplace":
        return RuntimeError if leaf else "grad"
    return {"type": TypeError}.get(role, role)


@pytest.mark.parametrize("key,name,leaf", list(_cases()))
def test_probe(key, name, leaf):
    shapes, call, roles = PROBES[key]
    want = _outcome(roles[name], leaf)
    t = _build(shapes)
    before = {n: x.clone() for n, x in t.items()}
    root = t[name].requires_grad_()
    if not leaf:
        t[name] = root * 1.0
    if want == "host":
        try:
            res = _run(call, t)
        except (TypeError, RuntimeError):
            return
        assert not any(isinstance(r, torch.Tensor) for r in res), "a detached torch result"
        return
    if want in (TypeError, RuntimeError):
        with pytest.raises(want) as e:
            _run(call, t)
        if want is TypeError:  # says what to do instead
            assert re.search(r"\b(use|pass)\b", str(e.value)), str(e.value)
        for n, x in t.items():
            assert torch.equal(x.detach(), before[n]), f"{n} was written"
        return
    res = _run(call, t)
    idx = [i for i, o in enumerate(res) if o.requires_grad]
    assert idx and all(res[i].grad_fn is not None for i in idx), "no result follows the input"
    g = np.random.default_rng(1)
    ws = [torch.from_numpy(g.standard_normal(res[i].shape)) for i in idx]
    sum((res[i].double() * w).sum() for i, w in zip(idx, ws)).backward()
    assert root.grad is not None
    _check_gradient(shapes, call, name, idx, ws, root.grad)


def _check_gradient(shapes, call, name, idx, ws, grad):
    """<grad, u> against the central difference of sum(w · outputs[idx])
    along a random direction u (the call itself, float32, under no_grad)."""
    u = torch.from_numpy(np.random.default_rng(2).standard_normal(grad.shape)).float()
    h = 1e-2
    val = []
    for sgn in (1, -1):
        t = _build(shapes)
        t[name] = t[name] + sgn * h * u
        with torch.no_grad():
            val.append(_run(call, t))
    fd = sum(((val[0][i].double() - val[1][i].double()) * w).sum()
             for i, w in zip(idx, ws)) / (2 * h)
    exact = (grad.double() * u.double()).sum()
    scale = grad.double().norm() * u.double().norm()
    assert abs(float(fd - exact)) <= 2e-3 * float(scale), (float(fd), float(exact))


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("key", sorted(PROBES))
def test_no_grad_changes_nothing(key, mode):
    """Every probed tensor requiring grad, under no_grad / inference_mode: the
    call runs and gives the outputs of plain tensors."""
    shapes, call, roles = PROBES[key]
    want = _run(call, _build(shapes))
    t = _build(shapes)
    for name in roles:
        t[name].requires_grad_()
    with torch.no_grad() if mode == "no_grad" else torch.inference_mode():
        got = _run(call, t)
    for a, b in zip(got, want):
        if isinstance(a, torch.Tensor):
            if not any(a is x for x in t.values()):  # (an input written in place keeps its flag)
                assert not a.requires_grad
            assert torch.equal(a.detach(), b)
        else:
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
