"""The core functions' guard for torch tensors: autograd and torch.compile.

The core (``cuprope.rope.api``, ``cuprope.tables``, ``cuprope.qknorm``,
``cuprope.lrpe``, ``cuprope.ggml``) launches kernels that autograd does not
see, and reads pointers and host values that a ``torch.compile`` trace does
not have. So a core call on torch tensors does not run the core as is when

* a tensor argument requires grad while grad mode is on: the call goes to the
  differentiable adapter of ``cuprope.torch`` with the same semantics (the
  result requires grad), or, where none exists, raises a TypeError naming
  what to use instead -- never a silently detached result;
* it writes in place (``inplace=True`` or ``out=``) into a leaf that requires
  grad (or a view of one) while grad mode is on: RuntimeError, as torch's own
  in-place ops raise;
* ``torch.compile`` (dynamo) is tracing it: the call becomes the adapter's
  ``torch.library`` custom op (``fullgraph=True`` traces through), or, where
  no custom op serves, a graph break that runs the core eagerly.

Under ``torch.no_grad()`` / ``torch.inference_mode()`` nothing changes.

``engaged`` is the per-call test: one ``requires_grad`` read per tensor (and,
for torch tensors, one call asking whether dynamo is tracing); NumPy, CuPy and
JAX arrays answer False at the first read. Everything else is imported only
when ``engaged`` answers True: the op's own adapter module (``route_*`` in
``cuprope.rope.torch``, ``cuprope.qknorm.torch``, ``cuprope.kvcache.torch``)
and the decision they share, ``cuprope.torch_route.call``; the front ends
with no adapter go to ``cuprope.torch_route`` directly.
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
