"""torch helpers shared by the GPU tests of the ops that write a KV cache
(test_gpu_kvcache, test_gpu_mla, test_gpu_prologue): dtypes by name, seeded
generators, random inputs, poisoned (random-byte) buffers and their bytes on
the host. torch is imported on first use, so importing this module needs none."""
import numpy as np


def _torch():
    import torch
    return torch


def tdt(name):
    """The torch dtype of ``name`` ("float32", "float16", "bfloat16", "fp8")."""
    torch = _torch()
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
            "fp8": torch.float8_e4m3fn}[name]


def gen(seed, device="cuda"):
    """A torch generator on ``device``: the tensors it draws live there."""
    g = _torch().Generator(device=device)
    g.manual_seed(seed)
    return g


def randn(shape, dtype, g):
    """Standard normal values drawn on ``g``'s device, rounded to ``dtype``."""
    return _torch().randn(shape, device=g.device, generator=g).to(tdt(dtype))


def sentinel(shape, dtype, g):
    """Random bytes viewed as ``dtype`` (no element is meaningful): a buffer
    whose untouched bytes a test can check after a kernel writes into it."""
    torch = _torch()
    t = tdt(dtype)
    n = int(np.prod(shape)) * torch.empty((), dtype=t).element_size()
    raw = torch.randint(0, 256, (n,), dtype=torch.uint8, device=g.device, generator=g)
    return raw.view(t).view(shape)


def host_bytes(t):
    """[..., D] tensor -> uint8 [..., D * itemsize] on the host (a copy, not a
    view of a CPU tensor)."""
    return t.contiguous().view(_torch().uint8).cpu().numpy().copy()


def record_results(monkeypatch, owners, name, pick):
    """A list that grows by ``pick(result)`` per call of ``name``, the same
    function wherever ``owners`` (modules that hold it, all patched alike)
    reach it."""
    seen = []
    real = getattr(owners[0], name)

    def recorded(*args, **kwargs):
        res = real(*args, **kwargs)
        seen.append(pick(res))
        return res

    for owner in owners:
        monkeypatch.setattr(owner, name, recorded)
    return seen


def apply_changes(args, change):
    """(q, k, v, pos, kw) of a call's arguments with ``change`` applied: a
    function per name, for one of the arrays (``q``, ``k``, ``v``, ``pos``)
    or, under any other name, for the keywords."""
    q, k, v, pos, kw = args
    for name, fn in change.items():
        if name in ("q", "k", "v", "pos"):
            q, k, v, pos = [fn(x) if n == name else x
                            for n, x in zip(("q", "k", "v", "pos"), (q, k, v, pos))]
        else:
            kw = fn(kw)
    return q, k, v, pos, kw


def count_calls(monkeypatch, owner, name):
    """A list that grows by one per call reaching ``owner.name`` (a module's
    function or a class's method: the general GPU path a fast path skips)."""
    calls = []
    real = getattr(owner, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls
