"""``python -m cuprope check``: apply RoPE in every supported configuration on
this machine's GPU (or the NumPy backend when there is none), compare with the
float64 reference and print a table. Exit status 1 if any row fails."""
from __future__ import annotations

import itertools
import time

import numpy as np

from .. import reference
from ..config import LAYOUTS, RopeConfig
from ..rope.api import rope_backward, rope_forward, rope_qk_forward

DTYPES = ("float32", "float16", "bfloat16")
MAX_HEAD_DIM = 1024  # the API takes larger heads; the cap keeps the check quick
# relative error budget (× max|x|) per dtype: fp32 1e-6; fp16/bf16 half an ulp of |out| ≤ max|x|
BUDGET = {"float32": 1e-6, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}


def _np_dtype(name):
    if name == "bfloat16":
        import ml_dtypes
        return ml_dtypes.bfloat16
    return np.dtype(name)


def _expected(x64, cfg, inverse, positions, offset):
    lay = cfg.layout
    xc = x64.transpose(0, 2, 1, 3) if lay == "bhsd" else (x64[None] if lay == "thd" else x64)
    b, s = xc.shape[:2]
    pos = reference.token_positions(b, s, positions=positions, offset=offset)
    y = reference.rotate(xc, reference.pair_angles(pos, cfg.inv_freq), rotary_dim=cfg.rotary_dim,
                         interleaved=cfg.interleaved, scale=cfg.scale, inverse=inverse)
    return y.transpose(0, 2, 1, 3) if lay == "bhsd" else (y[0] if lay == "thd" else y)


def head_dim_arg(value) -> int:
    """``value`` (an int, or its decimal text) as a head dim the check runs:
    an even integer from 4 to MAX_HEAD_DIM (4: the partial rows rotate
    R = D/2 rounded down to even, which must be >= 2). ValueError otherwise."""
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise ValueError(f"must be an even integer from 4 to {MAX_HEAD_DIM}, "
                             f"got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"must be an even integer from 4 to {MAX_HEAD_DIM}, got {value!r}")
    d = int(value)
    if d % 2 or not 4 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"must be an even integer from 4 to {MAX_HEAD_DIM}, got {d}")
    return d


def run(use_gpu: bool | None = None, head_dim: int = 128, verbose: bool = True,
        dtypes=DTYPES) -> bool:
    """Check every configuration at ``head_dim`` (see :func:`head_dim_arg`)
    for ``dtypes`` (names from DTYPES); True when every row is in budget.
    ``use_gpu`` None: the GPU when one is usable, else the NumPy backend."""
    from .info import cuda_state
    try:
        head_dim = head_dim_arg(head_dim)
    except ValueError as e:
        raise ValueError(f"head_dim {e}") from None
    bad = [d for d in dtypes if d not in DTYPES]
    if bad or not dtypes:
        raise ValueError(f"dtypes must be names from {DTYPES}, got {tuple(dtypes)}")
    state = cuda_state() if use_gpu is None else None
    gpu = state.usable if use_gpu is None else use_gpu
    if gpu:
        import cupy
        dev = cupy.cuda.Device()
        name = cupy.cuda.runtime.getDeviceProperties(dev.id)["name"]
        name = name.decode() if isinstance(name, bytes) else name
        backend = f"CUDA kernels on GPU {dev.id} ({name})"
    else:
        why = "GPU not requested: --cpu" if state is None else state.reason
        backend = f"NumPy backend ({why}): host float64 reference, cast to each dtype"
    rng = np.random.default_rng(0)
    rows, ok_all = [], True
    t0 = time.perf_counter()
    for dtype, interleaved, partial, layout in itertools.product(
            dtypes, (False, True), (False, True), LAYOUTS):
        rot = head_dim // 4 * 2 if partial else head_dim
        cfg = RopeConfig(rot, interleaved=interleaved, layout=layout)
        shape = {"bshd": (2, 33, 4, head_dim), "bhsd": (2, 4, 33, head_dim),
                 "thd": (66, 4, head_dim)}[layout]
        xh = rng.standard_normal(shape).astype(_np_dtype(dtype))
        pos = rng.integers(0, 1 << 20, shape[0] if layout == "thd" else 33)
        x64 = xh.astype(np.float64)
        if gpu:
            x = cupy.asarray(xh)
            p = cupy.asarray(pos)
            fwd = cupy.asnumpy(rope_forward(x, cfg, positions=p, offset=5)).astype(np.float64)
            bwd = cupy.asnumpy(rope_backward(x, cfg, positions=p, offset=5)).astype(np.float64)
            qo, ko = rope_qk_forward(x, x[..., :1, :] if layout != "bhsd" else x[:, :1], cfg,
                                     positions=p, offset=5)
            qk = cupy.asnumpy(qo).astype(np.float64)
        else:
            fwd = rope_forward(xh, cfg, positions=pos, offset=5).astype(np.float64)
            bwd = rope_backward(xh, cfg, positions=pos, offset=5).astype(np.float64)
            qk = rope_qk_forward(xh, xh, cfg, positions=pos, offset=5)[0].astype(np.float64)
        xmax = np.abs(x64).max()
        ref_f = _expected(x64, cfg, False, pos, 5)
        ref_b = _expected(x64, cfg, True, pos, 5)
        err = max(np.abs(fwd - ref_f).max(), np.abs(bwd - ref_b).max(), np.abs(qk - ref_f).max())
        rel = err / xmax
        ok = bool(np.isfinite(rel) and rel <= BUDGET[dtype])
        ok_all &= ok
        rows.append((dtype, "interleaved" if interleaved else "half", f"{rot}/{head_dim}", layout,
                     rel, "ok" if ok else "FAIL"))
    if verbose:
        print(f"cuprope check: {backend}")
        print("positions up to 2^20, offset 5; forward, backward and fused q/k vs float64 reference")
        hdr = ("dtype", "pairing", "R/D", "layout", "max|err|/max|x|", "result")
        print(f"{hdr[0]:<9} {hdr[1]:<12} {hdr[2]:<8} {hdr[3]:<6} {hdr[4]:>16} {hdr[5]}")
        for r in rows:
            print(f"{r[0]:<9} {r[1]:<12} {r[2]:<8} {r[3]:<6} {r[4]:>16.3e} {r[5]}")
        n_ok = sum(r[5] == "ok" for r in rows)
        print(f"{n_ok}/{len(rows)} configurations within budget "
              f"(fp32 1e-6, fp16 2^-10, bf16 2^-7 of max|x|) in {time.perf_counter() - t0:.1f} s")
    return ok_all
