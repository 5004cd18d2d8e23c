"""Fused QK-norm + RoPE on the GPU (skipped where there is no GPU): qknorm_kernel
against the float64 reference (cuprope.qknorm.reference, written from the
formulas), and the model rounding modes against transformers' Qwen3 and Gemma 3
attention on the same GPU, bit for bit.

Grid: dtypes (bf16 first), layouts, GQA/MQA, partial rotary, pairings, schemes
(default, per-head, MRoPE stream map, YaRN scale), orders, norm kinds (rms with
offset 0 / 1, no weight, l2), norm_over head / token, positions (implicit,
[B, S], offset, seq_offsets), strided q/k (slices of a fused qkv), in place.
Outputs are poisoned (``out=`` prefilled with NaN) so an unwritten element fails.

Tolerances (tests/oracle.py ``assert_matches``; inputs are bf16-exact values):
  * forward: fp32 within 2e-6·max|y| (the rotation's 1e-6 rule, doubled for the
    norm: the fp32 sum of squares and rsqrtf's 2 ulp); fp16/bf16 within one ulp
    of the reference rounded to the dtype plus that slack;
  * dx: the same rule with 4e-6·max|dx| (dx = r(u − n̂·mean(n̂u)) cancels);
  * dw (fp32 weights): |dw − dw64| ≤ 1e-5·Σ|g·n̂| per column, the float64 sum of
    the terms' magnitudes (the partial sums run in fp32);
  * determinism: two backward runs give the same bits (dq, dk, dw).
"""
import numpy as np
import pytest

from conftest import GPU_TESTS
import cuprope
from cuprope import qknorm, reference, scaling
from cuprope.qknorm import reference as qref
from oracle import assert_matches
from torch_helpers import count_calls, record_results

pytestmark = GPU_TESTS

torch = pytest.importorskip("torch", reason="needs torch: pip install torch")

DTYPES = ["bfloat16", "float16", "float32"]


def _dev(a, dtype):
    return torch.tensor(a, dtype=torch.float32).to(getattr(torch, dtype)).cuda()


def _host(t):
    return t.detach().float().cpu().numpy().astype(np.float64)


def _canon(a, layout):
    return a.transpose(0, 2, 1, 3) if layout == "bhsd" else (a[None] if layout == "thd" else a)


def _lay(a, layout):
    return a.transpose(0, 2, 1, 3) if layout == "bhsd" else (a[0] if layout == "thd" else a)


def _bf16_exact(rng, shape, scale=1.0):
    import ml_dtypes
    return (rng.standard_normal(shape) * scale).astype(ml_dtypes.bfloat16).astype(np.float32)


def _config(scheme, r, interleaved, layout, heads, rng):
    """(config, positions as numpy or None)."""
    if scheme == "per_head":
        return cuprope.RopeConfig(r, inv_freq=rng.uniform(1e-3, 1.0, (heads, r // 2)),
                                  interleaved=interleaved, layout=layout), None
    if scheme == "mrope":
        n = r // 2
        return scaling.mrope_config([n // 4, n // 4, n - 2 * (n // 4)], base=1e4,
                                    layout=layout), "streams"
    if scheme == "yarn":
        inv, sc = scaling.yarn_table(r, 1e4, 4.0, original_max_position_embeddings=64)
        return cuprope.RopeConfig(r, inv_freq=inv, scale=sc, interleaved=interleaved,
                                  layout=layout), None
    return cuprope.RopeConfig(r, base=1e4, interleaved=interleaved, layout=layout), None


def run_case(rng, *, dtype="bfloat16", layout="bshd", b=2, s=37, hq=4, hk=2, d=64, r=64,
             interleaved=False, scheme="default", order="norm_then_rope", over="head",
             norm="rms", weight=True, offset_w=0.0, positions=None, offset=0, seq_offsets=False,
             fused_qkv=False, w_dtype="float32", misalign=False):
    """Forward and backward on the GPU against the float64 reference.
    ``misalign``: q and k start one element past a 16-byte boundary (the
    general kernel instead of the fast path's 16-byte packs)."""
    if layout == "thd":
        b = 1
        if positions is None and not seq_offsets:
            positions = "bs"  # packed tokens take explicit positions
    cfg, pos_kind = _config(scheme, r, interleaved, layout, hq, rng)
    if scheme == "per_head":
        hk = hq
    qc, kc = _bf16_exact(rng, (b, s, hq, d), 2.0), _bf16_exact(rng, (b, s, hk, d), 0.7)
    gq, gk = _bf16_exact(rng, qc.shape), _bf16_exact(rng, kc.shape)
    wlen = (d, d) if over == "head" else (hq * d, hk * d)
    ws = [_bf16_exact(rng, (n,), 0.5) + (1.0 if offset_w == 0.0 else 0.0) for n in wlen]
    use_w = weight and norm == "rms"
    pos = None
    if pos_kind == "streams":
        pos = rng.integers(0, 3000, size=(3, b, s)) if layout != "thd" else rng.integers(0, 3000, size=(3, s))
    elif positions == "bs":
        pos = rng.integers(0, 100000, size=(s,) if layout == "thd" else (b, s))
    seq = rng.integers(0, 5000, size=(b,)) if seq_offsets else None

    def tensor(a, heads):
        a = _lay(a, layout)
        if misalign:
            flat = _dev(np.concatenate(([0.0], a.ravel())).astype(np.float32), dtype)
            return flat[1:].view(a.shape)
        if not fused_qkv:
            return _dev(np.ascontiguousarray(a), dtype)
        big = np.zeros(a.shape[:-2] + (heads + 3, d), np.float32)  # a fused projection slice
        big[..., 1:heads + 1, :] = a
        return _dev(big, dtype)[..., 1:heads + 1, :]

    q, k = tensor(qc, hq), tensor(kc, hk)
    dq_in, dk_in = tensor(gq, hq), tensor(gk, hk)
    wt = [_dev(w, w_dtype) if use_w else None for w in ws]
    tpos = None if pos is None else torch.tensor(pos).cuda()
    tseq = None if seq is None else torch.tensor(seq).cuda()
    kw = dict(q_weight=wt[0], k_weight=wt[1], eps=1e-5, norm=norm, weight_offset=offset_w,
              order=order, norm_over=over, positions=tpos, offset=offset, seq_offsets=tseq)
    outs = (torch.full_like(q, float("nan")), torch.full_like(k, float("nan")))
    yq, yk = qknorm.rope_qk_norm_forward(q, k, cfg, out=outs, **kw)
    grads = (torch.full_like(q, float("nan")), torch.full_like(k, float("nan")))
    dq, dk, dwq, dwk = qknorm.rope_qk_norm_backward(q, k, dq_in, dk_in, cfg, out=grads, **kw)
    dq2, dk2, dwq2, dwk2 = qknorm.rope_qk_norm_backward(q, k, dq_in, dk_in, cfg, **kw)
    torch.cuda.synchronize()
    # determinism: the same bits on a second run
    assert torch.equal(dq, dq2) and torch.equal(dk, dk2)
    if use_w:
        assert torch.equal(dwq, dwq2) and torch.equal(dwk, dwk2)
    # the float64 reference
    bb, ss = (1, s) if layout == "thd" else (b, s)
    p = reference.token_positions(bb, ss, positions=pos, offset=offset, seq_offsets=seq,
                                  n_streams=cfg.n_streams)
    ang = reference.pair_angles(p, cfg.inv_freq, cfg.stream_map)
    rk = dict(rotary_dim=r, interleaved=cfg.interleaved, scale=cfg.scale, eps=1e-5, over=over,
              order=order, weight_offset=offset_w)
    wh = [_host(w) if w is not None else None for w in wt]
    for x, g, w, y, dx, dw in ((qc, gq, wh[0], yq, dq, dwq), (kc, gk, wh[1], yk, dk, dwk)):
        ref = qref.forward(x, ang, weight=w, **rk)
        assert_matches(_canon(_host(y), layout), ref, 2 * np.abs(ref).max(), dtype)
        dref, dwref = qref.backward(x, g, ang, weight=w, **rk)
        assert_matches(_canon(_host(dx), layout), dref, 4 * np.abs(dref).max(), dtype)
        if w is None:
            assert dw is None
            continue
        assert dw.dtype == getattr(torch, w_dtype) and dw.shape == (w.shape[0],)
        mag = _dw_magnitude(x, g, ang, w, rk)
        err = np.abs(_host(dw) - dwref)
        tol = 1e-5 * mag + (0 if w_dtype == "float32" else np.abs(dwref) * 2.0 ** -7)
        assert (err <= tol).all(), (err / np.maximum(mag, 1e-30)).max()


def _dw_magnitude(x, g, ang, w, rk):
    """Σ|g·n̂| per weight column in float64 (the bound's scale)."""
    xa = np.abs(x)
    ga = np.abs(qref.rotation(g, ang, rk["rotary_dim"], rk["interleaved"], rk["scale"], True)) \
        if rk["order"] == "norm_then_rope" else np.abs(g)
    v = xa if rk["order"] == "norm_then_rope" else np.abs(
        qref.rotation(x, ang, rk["rotary_dim"], rk["interleaved"], rk["scale"]))
    dims = (-1,) if rk["over"] == "head" else (-2, -1)
    r = 1.0 / np.sqrt(np.mean(v * v, axis=dims, keepdims=True) + rk["eps"])
    t = ga * v * r
    return t.sum(axis=(0, 1, 2)) if rk["over"] == "head" else t.sum(axis=(0, 1)).reshape(-1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["bshd", "bhsd", "thd"])
@pytest.mark.parametrize("order", ["norm_then_rope", "rope_then_norm"])
@pytest.mark.parametrize("over", ["head", "token"])
def test_dtypes_layouts_orders(rng, dtype, layout, order, over):
    run_case(rng, dtype=dtype, layout=layout, order=order, over=over)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("d,r", [(64, 64), (64, 48), (128, 128), (256, 256), (80, 80), (96, 32)])
def test_head_dims_and_partial_rotary(rng, dtype, interleaved, d, r):
    run_case(rng, dtype=dtype, d=d, r=r, interleaved=interleaved, s=9)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("scheme", ["per_head", "mrope", "yarn"])
@pytest.mark.parametrize("order", ["norm_then_rope", "rope_then_norm"])
def test_schemes(rng, dtype, scheme, order):
    run_case(rng, dtype=dtype, scheme=scheme, order=order, d=64, r=64)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("norm,weight,offset_w", [("rms", True, 0.0), ("rms", True, 1.0),
                                                  ("rms", False, 0.0), ("l2", False, 0.0)])
@pytest.mark.parametrize("hk", [2, 1])
def test_norm_kinds_and_gqa(rng, dtype, norm, weight, offset_w, hk):
    run_case(rng, dtype=dtype, norm=norm, weight=weight, offset_w=offset_w, hk=hk)


@pytest.mark.parametrize("positions,offset,seq_offsets", [
    (None, 0, False), (None, 1000, True), ("bs", 0, False), ("bs", -7, True)])
@pytest.mark.parametrize("layout", ["bshd", "thd"])
def test_positions(rng, positions, offset, seq_offsets, layout):
    if layout == "thd" and (seq_offsets or positions is None):
        pytest.skip("packed tokens: one sequence, explicit positions")
    run_case(rng, positions=positions, offset=offset, seq_offsets=seq_offsets, layout=layout)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("w_dtype", ["bfloat16", "float16", "float32"])
def test_strided_qkv_slices_and_weight_dtypes(rng, dtype, w_dtype):
    run_case(rng, dtype=dtype, fused_qkv=True, w_dtype=w_dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("order", ["norm_then_rope", "rope_then_norm"])
def test_general_kernel_at_full_rotary(rng, dtype, order):
    """R = D per head through qknorm_kernel (misaligned tensors), as the fast path's cases."""
    run_case(rng, dtype=dtype, order=order, misalign=True)


def test_many_tokens_weight_gradient_is_deterministic(rng):
    """More tokens than warps (each warp takes several), both weights."""
    run_case(rng, b=4, s=1500, hq=8, hk=2, d=128, r=128)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_inplace_equals_out_of_place(rng, dtype):
    cfg = cuprope.RopeConfig(64)
    q = _dev(_bf16_exact(rng, (2, 17, 4, 64)), dtype)
    k = _dev(_bf16_exact(rng, (2, 17, 2, 64)), dtype)
    w = _dev(_bf16_exact(rng, (64,)), "float32")
    for over in ("head", "token"):
        ww = w if over == "head" else None
        yq, yk = qknorm.rope_qk_norm_forward(q, k, cfg, q_weight=ww, norm_over=over)
        q2, k2 = q.clone(), k.clone()
        rq, rk = qknorm.rope_qk_norm_forward(q2, k2, cfg, q_weight=ww, norm_over=over,
                                             inplace=True)
        assert rq is q2 and rk is k2
        assert torch.equal(q2, yq) and torch.equal(k2, yk)


@pytest.mark.parametrize("mode", ["fresh", "inplace", "tables"])
def test_fast_path_equals_the_general_path(rng, monkeypatch, mode):
    """Repeated forwards (new data, positions and offsets each step) take the
    fast path (no QkNormCall.gpu after the first) and give the bits of the
    general path (stream= given forces it), for the fast kernel and the
    general one (token norm)."""
    general = count_calls(monkeypatch, qknorm.QkNormCall, "gpu")
    stream = torch.cuda.current_stream()
    for over in ("head", "token"):
        cfg = cuprope.RopeConfig(64)
        n0 = len(general)
        for step in range(3):
            q = _dev(_bf16_exact(rng, (2, 5, 4, 64)), "bfloat16")
            k = _dev(_bf16_exact(rng, (2, 5, 2, 64)), "bfloat16")
            w = _dev(_bf16_exact(rng, (64 if over == "head" else 4 * 64,)), "float32")
            kw = dict(q_weight=w, norm_over=over)
            if mode == "tables":
                ang = rng.uniform(-3, 3, (2, 5, 32))
                cos = _dev(np.cos(np.concatenate([ang, ang], -1)), "bfloat16")
                sin = _dev(np.sin(np.concatenate([ang, ang], -1)), "bfloat16")
                kw.update(tables=(cos, sin), rounding="cast_then_weight")
                w = w.bfloat16()
                kw["q_weight"] = w
            else:
                kw.update(positions=_dev(rng.integers(0, 4000, (2, 5)), "float32").int(),
                          offset=int(rng.integers(0, 100)))
            want = qknorm.rope_qk_norm_forward(q, k, cfg, stream=stream, **kw)
            before = len(general)
            if mode == "inplace":
                got = qknorm.rope_qk_norm_forward(q, k, cfg, inplace=True, **kw)
                assert got[0] is q and got[1] is k
            else:
                got = qknorm.rope_qk_norm_forward(q, k, cfg, **kw)
            assert len(general) == before + (1 if step == 0 else 0), (over, step)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (over, step)
        assert len(general) == n0 + 3 + 1


@pytest.mark.parametrize("mode", ["both weights", "q weight only", "no weight", "tables"])
def test_backward_fast_path_equals_the_general_path(rng, monkeypatch, mode):
    """Repeated backwards (new data, gradients, positions and offsets each
    step) take the fast path (no QkNormCall.gpu after the first) and give
    the bits of the general path (stream= given forces it): dq, dk and the
    weight gradients (None where there is no weight), for the fast kernel
    and the general one (token norm)."""
    general = count_calls(monkeypatch, qknorm.QkNormCall, "gpu")
    stream = torch.cuda.current_stream()
    for over in ("head", "token"):
        cfg = cuprope.RopeConfig(64)
        n0 = len(general)
        for step in range(3):
            q = _dev(_bf16_exact(rng, (2, 5, 4, 64)), "bfloat16")
            k = _dev(_bf16_exact(rng, (2, 5, 2, 64)), "bfloat16")
            gq = _dev(_bf16_exact(rng, (2, 5, 4, 64)), "bfloat16")
            gk = _dev(_bf16_exact(rng, (2, 5, 2, 64)), "bfloat16")
            wlen = 64 if over == "head" else 4 * 64
            kw = dict(norm_over=over)
            if mode != "no weight":
                kw["q_weight"] = _dev(_bf16_exact(rng, (wlen,)), "bfloat16")
            if mode in ("both weights", "tables"):
                kw["k_weight"] = _dev(_bf16_exact(rng, (wlen // 2 if over == "token" else 64,)),
                                      "bfloat16")
            if mode == "tables":
                ang = rng.uniform(-3, 3, (2, 5, 32))
                kw["tables"] = (_dev(np.cos(np.concatenate([ang, ang], -1)), "bfloat16"),
                                _dev(np.sin(np.concatenate([ang, ang], -1)), "bfloat16"))
                kw["rounding"] = "cast_then_weight"  # tables take a model rounding
            else:
                kw.update(positions=_dev(rng.integers(0, 4000, (2, 5)), "float32").int(),
                          offset=int(rng.integers(0, 100)))
            want = qknorm.rope_qk_norm_backward(q, k, gq, gk, cfg, stream=stream, **kw)
            before = len(general)
            got = qknorm.rope_qk_norm_backward(q, k, gq, gk, cfg, **kw)
            assert len(general) == before + (1 if step == 0 else 0), (over, step)
            for g, w in zip(got, want):
                assert (g is None) == (w is None), (over, step)
                assert g is None or torch.equal(g, w), (over, step)
            assert (got[2] is None) == ("q_weight" not in kw)
            assert (got[3] is None) == ("k_weight" not in kw)
        assert len(general) == n0 + 3 + 1


def _ulps(got, want, dtype):
    """Elementwise distance in units of the dtype's spacing at the largest
    |want| of the element's head (the rotation's sums cancel: a result near 0
    moves by the spacing of its products)."""
    g, w = _host(got), _host(want)
    mant = {"bfloat16": 8, "float16": 11, "float32": 24}[dtype]
    top = np.maximum(np.abs(w).max(-1, keepdims=True), 1e-30)
    return np.abs(g - w) / np.exp2(np.floor(np.log2(top)) - (mant - 1))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("angles", ["tables", "norm_then_rope", "rope_then_norm"])
@pytest.mark.parametrize("tokens", [(1, 3), (4, 75)])
def test_rows_model_kernel_equals_the_general_kernel(rng, monkeypatch, dtype, interleaved,
                                                     angles, tokens):
    """The model modes in qknorm_rows_kernel (MODEL: the caller's tables or
    computed angles, forward and backward) against qknorm_kernel (forced:
    the rows kernel refused), same inputs: within two ulp of the dtype at
    its head's largest value (the two sum the squares and the backward's dr
    in their own fp32 orders; a flipped rounding moves a product) on at most
    2 % of the elements (fp32: 16 ulp, any share); dw within one rounding to
    its dtype (fp32: 2⁻¹⁴) of its largest value. Decode (3 tokens: a token's
    heads split over warps) and prefill sizes."""
    from cuprope.qknorm import launch as ql
    b, s = tokens
    d, hq, hk = 128, 8, 2
    cfg = cuprope.RopeConfig(d, interleaved=interleaved, layout="bshd")
    q, k = (_dev(_bf16_exact(rng, (b, s, h, d), 2.0), dtype) for h in (hq, hk))
    gq, gk = (_dev(_bf16_exact(rng, (b, s, h, d)), dtype) for h in (hq, hk))
    rounding = "cast_then_weight" if dtype != "float32" else "weight_then_cast"
    wdt = dtype if rounding == "cast_then_weight" else "float32"
    kw = dict(q_weight=_dev(_bf16_exact(rng, (d,), 0.3) + 1.0, wdt),
              k_weight=_dev(_bf16_exact(rng, (d,), 0.3) + 1.0, wdt), eps=1e-6,
              rounding=rounding)
    if angles == "tables":
        ang = rng.uniform(-3, 3, (b, s, d // 2))
        full = np.repeat(ang, 2, -1) if interleaved else np.concatenate([ang, ang], -1)
        kw["tables"] = (_dev(np.cos(full), dtype), _dev(np.sin(full), dtype))
    else:
        kw.update(order=angles, positions=_dev(rng.integers(0, 40000, (b, s)), "float32").int())
    names = record_results(monkeypatch, (ql,), "geometry", lambda geo: geo.kernel_name)
    runs = []
    for rows in (True, False):
        if not rows:
            monkeypatch.setattr(ql, "fast_vec", lambda *a: 0)
        fwd = qknorm.rope_qk_norm_forward(q, k, cfg, stream=torch.cuda.current_stream(), **kw)
        bwd = qknorm.rope_qk_norm_backward(q, k, gq, gk, cfg,
                                           stream=torch.cuda.current_stream(), **kw)
        runs.append((*fwd, *bwd))
    assert all("qknorm_rows_kernel" in n and n.endswith(", true>") for n in names[:2]), names
    assert all("qknorm_kernel" in n for n in names[2:]), names
    worst = []
    for i, (got, want) in enumerate(zip(*runs)):
        if i < 4:  # in ulp of the dtype at the head's largest value, and the share moved
            u = _ulps(got, want, dtype)
            worst.append((u.max(), (u > 0).mean()))
        else:  # dw: relative to its largest value
            g, w = got.float(), want.float()
            worst.append((((g - w).abs().max() / w.abs().max()).item(),))
    # fp32: r one ulp apart moves every element of its head, and the backward's dr
    # (a sum that cancels) by more; 16-bit: the rounding to the dtype absorbs most
    most, share = (16.0, 1.0) if dtype == "float32" else (2.0, 0.02)
    dw_tol = {"bfloat16": 2.0 ** -7, "float16": 2.0 ** -10}.get(wdt, 2.0 ** -14)
    assert all(w[0] <= most and w[1] <= share for w in worst[:4]), worst
    assert all(w[0] <= dw_tol for w in worst[4:]), worst


# Known defect: on an H100 the fp16 cast_then_weight case with the norm per head
# before RoPE put 2 of 4608 elements ~3 fp16 ulp from the NumPy emulation
# (twice, same elements); suspected: the kernel's rsqrtf against the
# emulation's 1/sqrt flipping the cast to fp16 before the weight.
_KNOWN = pytest.mark.xfail(strict=True, reason="known fp16 cast_then_weight rounding flip on the "
                                               "GPU: 2 of 4608 elements ~3 ulp from the emulation")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("rounding", ["cast_then_weight", "weight_then_cast"])
@pytest.mark.parametrize("order,over,r", [("norm_then_rope", "head", 64),
                                          ("norm_then_rope", "token", 48),
                                          ("rope_then_norm", "head", 64)])
def test_model_modes_without_tables(rng, dtype, rounding, order, over, r, request):
    if (dtype, rounding, order, over) == ("float16", "cast_then_weight", "norm_then_rope", "head"):
        request.applymarker(_KNOWN)
    """The model modes with computed angles (qknorm_rows_kernel's model modes
    at R = D, qknorm_kernel for the norm over the token) against the NumPy
    emulation of the same rounding
    sequence (qknorm_reference.model_forward / model_backward): within one ulp
    (the GPU's rsqrtf and sum orders against the CPU's 1/sqrt)."""
    import ml_dtypes
    np_dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16
    cfg = cuprope.RopeConfig(r, base=1e4)
    b, s, hq, hk, d = 2, 9, 4, 2, 64
    qc, kc = _bf16_exact(rng, (b, s, hq, d), 2.0), _bf16_exact(rng, (b, s, hk, d))
    gq, gk = _bf16_exact(rng, qc.shape), _bf16_exact(rng, kc.shape)
    wl = (d, d) if over == "head" else (hq * d, hk * d)
    ws = [_bf16_exact(rng, (n,), 0.3) + 1.0 for n in wl]
    wt = [_dev(w, dtype) for w in ws]
    ws = [_host(w) for w in wt]  # the weights' values in the dtype
    kw = dict(q_weight=wt[0], k_weight=wt[1], eps=1e-5, order=order, norm_over=over,
              rounding=rounding, offset=5)
    q, k = _dev(qc, dtype), _dev(kc, dtype)
    yq, yk = qknorm.rope_qk_norm_forward(q, k, cfg, **kw)
    dq, dk, _, _ = qknorm.rope_qk_norm_backward(q, k, _dev(gq, dtype), _dev(gk, dtype), cfg,
                                                **kw)
    ang = reference.pair_angles(reference.token_positions(b, s, offset=5), cfg.inv_freq)
    rk = dict(rotary_dim=r, interleaved=False, rounding=rounding, angles=ang, eps=1e-5,
              over=over, order=order)
    for x, g, w, y, dx in ((qc, gq, ws[0], yq, dq), (kc, gk, ws[1], yk, dk)):
        ref = qref.model_forward(x, np_dt, weight=w, **rk)
        assert_matches(_host(y), ref, np.abs(ref).max(), dtype)
        dref, _ = qref.model_backward(x, g, np_dt, weight=w, **rk)
        assert_matches(_host(dx), dref, 2 * np.abs(dref).max(), dtype)


# ---------------------------------------------------------------- HF models on the GPU
@pytest.mark.parametrize("model_type,rounding,offset", [
    ("qwen3", "cast_then_weight", 0.0), ("gemma3_text", "weight_then_cast", 1.0)])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_model_rounding_is_hf_bit_for_bit_on_the_gpu(model_type, rounding, offset, dtype, seed):
    from test_qknorm import _hf_attention_qk
    td = getattr(torch, dtype)
    qp, kp, qh, kh, wq, wk, cos, sin, eps = _hf_attention_qk(model_type, td, seed, device="cuda")
    yq, yk = qknorm.rope_qk_norm_forward(qp, kp, cuprope.RopeConfig(32), q_weight=wq,
                                         k_weight=wk, eps=eps, weight_offset=offset,
                                         rounding=rounding, tables=(cos, sin))
    assert yq.is_cuda
    assert torch.equal(yq, qh), (yq.float() - qh.float()).abs().max()
    assert torch.equal(yk, kh), (yk.float() - kh.float()).abs().max()


@pytest.mark.parametrize("model_type", ["qwen3", "gemma3_text"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_model_logits_on_the_gpu(model_type, dtype):
    """A tiny Qwen3 / Gemma 3 with every attention layer swapped to the fused call:
    the same logits (bf16 bit for bit; see test_qknorm.model_logits_match)."""
    from test_qknorm import model_logits_match
    model_logits_match(model_type, getattr(torch, dtype), 0, device="cuda")


@pytest.mark.parametrize("model_type,rounding,offset", [
    ("qwen3", "cast_then_weight", 0.0), ("gemma3_text", "weight_then_cast", 1.0)])
def test_model_rounding_backward_on_the_gpu(model_type, rounding, offset):
    """The model modes' backward against HF's autograd on the GPU (see
    test_qknorm.hf_backward_match): dq, dk bit for bit."""
    from test_qknorm import hf_backward_match
    hf_backward_match(model_type, rounding, offset, device="cuda")


def test_model_gradients_on_the_gpu():
    """Every parameter's gradient of tiny Qwen3 / Gemma 3 models swapped to the fused call."""
    from test_qknorm import MODEL_MODES, model_gradients_match
    fractions = [model_gradients_match(m, seed, device="cuda") for m in MODEL_MODES
                 for seed in (0, 1)]
    assert sum(f == 1.0 for f in fractions) >= 2, fractions


def test_torch_adapter_compiles_on_the_gpu(rng):
    from cuprope import torch as ctorch
    cfg = cuprope.RopeConfig(64)
    q = _dev(_bf16_exact(rng, (2, 9, 4, 64)), "bfloat16").requires_grad_()
    k = _dev(_bf16_exact(rng, (2, 9, 2, 64)), "bfloat16").requires_grad_()
    w = _dev(_bf16_exact(rng, (64,)), "bfloat16").requires_grad_()

    def f(q, k, w):
        a, b = ctorch.rope_qk_norm(q, k, cfg, q_weight=w, k_weight=w)
        return a.float().square().sum() + b.float().sum()

    eager = torch.autograd.grad(f(q, k, w), (q, k, w))
    comp = torch.autograd.grad(torch.compile(f, fullgraph=True)(q, k, w), (q, k, w))
    for a, b in zip(eager, comp):
        assert torch.equal(a, b)
