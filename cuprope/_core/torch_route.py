"""Where a core call on torch tensors goes when ``torch_guard.engaged`` says
it cannot run as is: :func:`call` decides for every front end (each op's
torch module builds its arguments); front ends with no adapter use
:func:`no_adapter`, :func:`untraceable` and :func:`inference_op`.
"""
from __future__ import annotations

import torch


LEAF = "a leaf Variable that requires grad is being used in an in-place operation."
VIEW = "a view of a leaf Variable that requires grad is being used in an in-place operation."


def requires_grad(t) -> bool:
    return bool(getattr(t, "requires_grad", False))


def _check_target(t, name):
    """RuntimeError, as torch's own in-place ops raise, when ``t`` (written by
    the call) is a leaf that requires grad or a view of one."""
    if not requires_grad(t):
        return
    if t.is_leaf:
        raise RuntimeError(f"{name}(): {LEAF} Update a parameter under torch.no_grad(), or "
                           f"rotate a copy.")
    base = t._base
    if base is not None and base.is_leaf:
        raise RuntimeError(f"{name}(): {VIEW} Update it under torch.no_grad(), or rotate a copy.")


def call(name, tensors, targets, target_kind, core, adapter, instead, stream=None):
    """Run one core call on torch tensors.

    name: the public function (for messages); tensors: every tensor argument
    autograd could differentiate; targets: the tensors the call writes (the
    ``out=`` tensors, the inputs for ``inplace=True``, else ()); target_kind:
    "out", "inplace" or None; core(): the core call as is; adapter(): the
    same computation through ``cuprope.torch`` (autograd eagerly, the custom
    op under torch.compile) as new tensors, a tensor or a tuple, or None where
    none exists; instead: what the TypeError tells the user to call.

    * grad mode on and a tensor argument requires grad: the op's
      differentiable adapter (the result requires grad), or a TypeError
      naming what to use;
    * grad mode on and a write (``inplace=True``, ``out=``) into a leaf that
      requires grad, or a view of one: RuntimeError, as torch's in-place
      ops;
    * ``torch.compile`` tracing: the adapter's custom op, else a graph
      break."""
    tracing = torch.compiler.is_compiling()
    grad = torch.is_grad_enabled() and (any(requires_grad(t) for t in tensors)
                                        or any(requires_grad(t) for t in targets))
    if grad:
        for t in targets:
            _check_target(t, name)
    if not (grad or tracing):
        return core()
    if grad:
        why = None
        if adapter is None:
            why = "is not differentiable by autograd"
        elif target_kind == "out":
            why = "with out= does not support automatic differentiation"
        elif stream is not None:
            why = "with stream= does not support automatic differentiation"
        if why is not None:
            raise TypeError(f"{name}() {why}, but a tensor argument requires grad: use "
                            f"{instead}, or call {name} under torch.no_grad() for a result "
                            f"without gradients")
    if adapter is None or stream is not None:
        return torch.compiler.disable(core)()  # a clean graph break: the core runs eagerly
    res = adapter()
    if not targets:
        return res
    single = isinstance(res, torch.Tensor)
    for t, r in zip(targets, (res,) if single else res):
        # torch renews a view's autograd data lazily: reading grad_fn first lets a view
        # whose base an earlier target's copy made require grad take this copy too
        t.grad_fn
        t.copy_(r)  # in place through autograd: the gradient flows into the old value
    return targets[0] if single else tuple(targets)


def targets_of(xs, outs, inplace):
    """(the tensors a call writes, their kind) for ``call``."""
    if outs is not None:
        return tuple(outs), "out"
    if inplace:
        return tuple(xs), "inplace"
    return (), None


def no_adapter(name, tensors, targets, kind, core, instead):
    """A front end with no ``cuprope.torch`` adapter:
    TypeError under autograd, a graph break under torch.compile."""
    return call(name, tensors, targets, kind, core, None, instead)


def untraceable(core):
    """``core()`` (a front end that reads pointers before it reaches the core
    functions, such as ``cuprope.ggml.rope``): a graph break under
    torch.compile, else the call itself (whose core calls route as usual)."""
    if torch.compiler.is_compiling():
        return torch.compiler.disable(core)()
    return core()


TRAINING = "cuprope.torch.rope_qk for training (this is an inference op)"


def inference_op(name, tensors, written, core, instead=TRAINING):
    """An inference op reading ``tensors`` and writing ``written`` in place
    (a cache append, say): TypeError
    under autograd naming ``instead`` (RuntimeError into a leaf that requires
    grad), a graph break under torch.compile."""
    return call(name, tensors, written, "inplace", core, None, instead)


def check_inference(name, tensors, written, instead=TRAINING):
    """``inference_op``'s refusals alone, for a front end that runs its own
    custom op: raises as it does when grad mode is on and a tensor of
    ``tensors`` or ``written`` requires grad; else returns None."""
    if torch.is_grad_enabled() and any(requires_grad(t) for t in (*tensors, *written)):
        call(name, tensors, written, "inplace", None, None, instead)  # raises
