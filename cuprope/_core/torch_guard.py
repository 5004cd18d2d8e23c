"""The core functions' guard for torch tensors: must this call be routed?

``engaged`` costs one ``requires_grad`` read per array (NumPy, CuPy and JAX
arrays answer False at once) and, for torch tensors, one question: is dynamo
tracing? When it answers True the front end hands the call to
``torch_route`` (imported only then), whose docstring gives the rules.
"""
from __future__ import annotations


def engaged(a, b=None, out=None) -> bool:
    """True when a call on ``a`` (and ``b``; ``out`` a tensor, a pair or None)
    must go through its route (the module docstring): ``a`` is a torch tensor and a
    tensor requires grad, or ``out`` is given, or dynamo is tracing."""
    rg = getattr(a, "requires_grad", None)
    if rg is None:
        return False  # not a torch tensor
    if rg or out is not None or getattr(b, "requires_grad", False):
        return True
    return _tracing()


def engaged_any(*xs) -> bool:
    """``engaged`` for an op that reads or writes every array of ``xs`` (None
    skipped; an inference op: ``out`` does not matter): one of them requires
    grad, or one is a torch tensor while dynamo is tracing."""
    seen = False
    for x in xs:
        rg = getattr(x, "requires_grad", None)
        if rg:
            return True
        seen = seen or rg is not None
    return seen and _tracing()


def _tracing() -> bool:
    """Whether dynamo is tracing; the first call rebinds the name to
    ``torch.compiler.is_dynamo_compiling`` (a torch tensor means torch is
    imported), which dynamo evaluates as True while it traces."""
    global _tracing
    import torch
    _tracing = torch.compiler.is_dynamo_compiling
    return _tracing()
