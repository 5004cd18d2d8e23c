"""The timed cases of ``python -m cuprope bench``, shared with
benchmarks/bench_suite.py: cuprope against a device copy of the same bytes
(the fewest an op must move: inputs read once, outputs written once) and the
installed peers. ``time_gpu``: CUDA-event medians after warm-up, a GPU sleep
queued before each start so host launch overhead stays outside the interval.
"""
from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass

SHAPES = {
    # name: (B, S, Hq, Hk, D, R)
    "llama3-8b": (4, 4096, 32, 8, 128, 128),
    "seq32k": (1, 32768, 32, 8, 128, 128),
    "mha-d64": (8, 2048, 16, 16, 64, 64),
    "d256": (2, 4096, 16, 4, 256, 256),
    "partial-r64": (4, 4096, 32, 8, 128, 64),
}
DECODE = (1, 1, 32, 8, 128, 128)

OPS = ("qk_fwd", "qk_bwd", "qk_inplace", "fwd", "qkv_slices")


@dataclass
class Row:
    case: str
    op: str
    dtype: str
    impl: str
    shape: tuple
    nbytes: int
    seconds: float
    copy_seconds: float

    @property
    def tbps(self):
        return self.nbytes / self.seconds / 1e12

    @property
    def ratio(self):
        return self.copy_seconds / self.seconds


def torch_module():
    """torch, imported on first use (the CLI runs without it)."""
    import torch
    return torch


def time_gpu(fn, reps=30, warm=5, sleep_cycles=2_000_000):
    """Median seconds of ``fn`` measured with CUDA events."""
    torch = torch_module()
    for _ in range(warm):
        fn()
    out = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(sleep_cycles)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e-3)
    return statistics.median(out)


def hf_rope(q, k, cos, sin):
    """The HF transformers formula (rotate_half), cos/sin [S, D] broadcast over B and H."""
    def rot(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch_module().cat((-x2, x1), dim=-1)
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return q * c + rot(q) * s, k * c + rot(k) * s


def cos_sin_tables(s, d, base, dtype, device):
    torch = torch_module()
    inv = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64, device=device) / d))
    ang = torch.arange(s, dtype=torch.float64, device=device)[:, None] * inv[None, :]
    emb = torch.cat((ang, ang), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def run_case(name, shape, op, dtype_name, peers=True, sets=2, reps=30):
    """Rows for one (shape, op, dtype): copy, cuprope and the peers."""
    import cuprope
    torch = torch_module()
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype_name]
    b, s, hq, hk, d, r = shape
    cfg = cuprope.RopeConfig(r)
    esz = torch.empty((), dtype=dt).element_size()
    if op == "qkv_slices":
        bufs = []
        for _ in range(sets):
            qkv = torch.randn(b, s, (hq + 2 * hk) * d, device="cuda", dtype=dt)
            q = qkv[..., : hq * d].unflatten(-1, (hq, d))
            k = qkv[..., hq * d: (hq + hk) * d].unflatten(-1, (hk, d))
            bufs.append((q, k))
    else:
        bufs = [(torch.randn(b, s, hq, d, device="cuda", dtype=dt),
                 torch.randn(b, s, hk, d, device="cuda", dtype=dt)) for _ in range(sets)]
    outs = [(torch.empty(b, s, hq, d, device="cuda", dtype=dt),
             torch.empty(b, s, hk, d, device="cuda", dtype=dt)) for _ in range(sets)]
    n_q, n_k = b * s * hq * d, b * s * hk * d
    if op == "fwd":
        nbytes = 2 * n_q * esz
    elif op == "qk_inplace":
        nbytes = 2 * (n_q + n_k) * esz * r // d
    else:
        nbytes = 2 * (n_q + n_k) * esz
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t_copy = time_gpu(lambda: dst.copy_(src), reps=reps)
    i = [0]

    def pick():
        j = i[0] % sets
        i[0] += 1
        return j

    def ours():
        j = pick()
        q, k = bufs[j]
        if op == "fwd":
            cuprope.rope_forward(q, cfg, out=outs[j][0])
        elif op == "qk_bwd":
            cuprope.rope_qk_backward(q, k, cfg, out=outs[j])
        elif op == "qk_inplace":
            cuprope.rope_qk_forward(q, k, cfg, inplace=True)
        else:
            cuprope.rope_qk_forward(q, k, cfg, out=outs[j])

    rows = [Row(name, op, dtype_name, "copy", shape, nbytes, t_copy, t_copy),
            Row(name, op, dtype_name, "cuprope", shape, nbytes, time_gpu(ours, reps=reps), t_copy)]
    if peers and op in ("qk_fwd", "qkv_slices") and r == d:
        cos, sin = cos_sin_tables(s, d, 10000.0, dt, "cuda")

        def eager():
            q, k = bufs[pick()]
            hf_rope(q, k, cos, sin)
        rows.append(Row(name, op, dtype_name, "torch-eager", shape, nbytes, time_gpu(eager, reps=reps),
                        t_copy))
        from ..rope import tables

        def hf_tables():  # the same HF formula through cuprope's cos/sin-table source
            j = pick()
            tables.rope_qk_table_forward(*bufs[j], cos, sin, out=outs[j])
        rows.append(Row(name, op, dtype_name, "cuprope-hf-tables", shape, nbytes,
                        time_gpu(hf_tables, reps=reps), t_copy))
        try:
            compiled = torch.compile(hf_rope, dynamic=False)

            def comp():
                q, k = bufs[pick()]
                compiled(q, k, cos, sin)
            rows.append(Row(name, op, dtype_name, "torch-compile", shape, nbytes,
                            time_gpu(comp, reps=reps), t_copy))
        except Exception as e:  # no compiler toolchain, etc.
            print(f"  torch.compile skipped: {type(e).__name__}: {e}", file=sys.stderr)
        rows += _other_peers(name, op, dtype_name, shape, nbytes, t_copy, bufs, cos, sin, pick, reps)
    return rows


SCHEME_OPS = ("yarn", "mrope", "lrpe_silu")


def run_scheme_case(name, shape, op, dtype_name, sets=2, reps=30):
    """Rows for a frequency scheme on the fused q/k forward (out-of-place):
    YaRN (Qwen2.5's config block: a scaled table and a cos/sin scale), Qwen2-VL
    MRoPE (three position streams [3, B, S]) and LRPE (one tensor, per-head θ,
    SiLU before the rotation; bytes: x read, o written)."""
    import numpy as np

    import cuprope
    from .. import lrpe, schemes
    torch = torch_module()
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype_name]
    b, s, hq, hk, d, r = shape
    esz = torch.empty((), dtype=dt).element_size()
    bufs = [(torch.randn(b, s, hq, d, device="cuda", dtype=dt),
             torch.randn(b, s, hk, d, device="cuda", dtype=dt)) for _ in range(sets)]
    outs = [(torch.empty_like(q), torch.empty_like(k)) for q, k in bufs]
    i = [0]

    def pick():
        j = i[0] % sets
        i[0] += 1
        return j

    if op == "lrpe_silu":
        nbytes = 2 * b * s * hq * d * esz
        theta = np.random.default_rng(0).uniform(0.01, 1.0, (hq, d // 2))

        def ours():
            j = pick()
            lrpe.rotate_1d_forward(bufs[j][0], theta, act="silu", out=outs[j][0])
    else:
        nbytes = 2 * b * s * (hq + hk) * d * esz
        pos = None
        if op == "yarn":
            cfg = schemes.rope_config_from_hf({
                "rope_theta": 1e6, "head_dim": d, "max_position_embeddings": 131072,
                "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                 "original_max_position_embeddings": 32768}})
        else:
            cfg = schemes.mrope_config([d // 8, 3 * d // 16, 3 * d // 16], base=1e6)
            pos = torch.randint(0, 4096, (3, b, s), device="cuda", dtype=torch.int32)

        def ours():
            j = pick()
            cuprope.rope_qk_forward(*bufs[j], cfg, positions=pos, out=outs[j])
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t_copy = time_gpu(lambda: dst.copy_(src), reps=reps)
    return [Row(name, op, dtype_name, "copy", shape, nbytes, t_copy, t_copy),
            Row(name, op, dtype_name, "cuprope", shape, nbytes, time_gpu(ours, reps=reps), t_copy)]


_PEERS = (("liger_kernel", "liger-kernel"), ("flash_attn", "flash-attention"),
          ("flashinfer", "FlashInfer"))


def _other_peers(name, op, dtype_name, shape, nbytes, t_copy, bufs, cos, sin, pick, reps):
    """Liger, flash-attention and FlashInfer: their call paths are not wired
    into this suite, so each is reported as skipped, never silently dropped."""
    import importlib.util
    for mod, label in _PEERS:
        if importlib.util.find_spec(mod) is None:
            _note(f"{label} not installed: skipped")
        else:
            _note(f"{label} is installed but this suite does not time it yet: skipped")
    return []


_NOTES: set = set()


def _note(msg):
    if msg not in _NOTES:
        _NOTES.add(msg)
        print(f"  note: {msg}", file=sys.stderr)
