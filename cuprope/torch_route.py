"""Where a core call on torch tensors goes when ``cuprope.torch_guard.engaged``
says it cannot run the core as is (that module's docstring gives the rules).

``call`` decides for every front end; the functions after it build its
arguments for one family each (core RoPE, cos/sin tables, fused QK-norm, and
the calls with no adapter). Imported only once a torch tensor needs it.
"""
from __future__ import annotations

import torch

from . import torch as ctorch
from .torch_qknorm import rope_qk_norm as _qknorm_adapter
from .torch_qknorm import rope_qk_norm_backward_op

LEAF = "a leaf Variable that requires grad is being used in an in-place operation."
VIEW = "a view of a leaf Variable that requires grad is being used in an in-place operation."


def _requires_grad(t) -> bool:
    return bool(getattr(t, "requires_grad", False))


def _check_target(t, name):
    """RuntimeError, as torch's own in-place ops raise, when ``t`` (written by
    the call) is a leaf that requires grad or a view of one."""
    if not _requires_grad(t):
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
    none exists; instead: what the TypeError tells the user to call."""
    tracing = torch.compiler.is_compiling()
    grad = torch.is_grad_enabled() and (any(_requires_grad(t) for t in tensors)
                                        or any(_requires_grad(t) for t in targets))
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
        t.copy_(r)  # in place through autograd: the gradient flows into the old value
    return targets[0] if single else tuple(targets)


def _targets(xs, outs, inplace):
    if outs is not None:
        return tuple(outs), "out"
    if inplace:
        return tuple(xs), "inplace"
    return (), None


def rope(name, xs, config, inverse, positions, offset, seq_offsets, outs, inplace, stream, core):
    """``cuprope.api``'s four functions: the adapter is ``cuprope.torch.rope``
    / ``rope_qk`` (with the inverse rotation for the backward functions, whose
    own gradient is the forward rotation). Returns a tuple like ``xs``."""
    targets, kind = _targets(xs, outs, inplace)

    def adapter():
        return ctorch.rotate(xs, config, inverse, positions, offset, seq_offsets)

    return call(name, xs, targets, kind, core, adapter,
                "cuprope.torch.rope_qk(q, k, config, ...)" if len(xs) == 2
                else "cuprope.torch.rope(x, config, ...)", stream)


def tables(name, xs, cos, sin, layout, interleaved, inverse, outs, inplace, stream, core):
    """``cuprope.tables``: q and k go to ``cuprope.torch``'s table op (HF's
    gradient); a single tensor, or tables that require grad, have no adapter."""
    targets, kind = _targets(xs, outs, inplace)
    adapter = None
    if len(xs) == 2 and not (_requires_grad(cos) or _requires_grad(sin)):
        def adapter():
            return ctorch.table_rotate(xs[0], xs[1], cos, sin, layout, interleaved, inverse)
    return call(name, xs + (cos, sin), targets, kind, core, adapter,
                "cuprope.torch.apply_rotary_pos_emb(q, k, cos, sin) (differentiable in q, k, "
                "and in cos/sin through HF's formula)", stream)


def qknorm_forward(name, q, k, config, kw, outs, inplace, stream, core):
    """``cuprope.qknorm.rope_qk_norm_forward``: the adapter is
    ``cuprope.torch.rope_qk_norm`` (gradients for q, k and the weights; none
    for cos/sin tables, so tables that require grad have no adapter)."""
    targets, kind = _targets((q, k), outs, inplace)
    tabs = kw.get("tables") or ()
    tensors = (q, k, kw.get("q_weight"), kw.get("k_weight"), *tabs)
    adapter = None
    if not any(_requires_grad(t) for t in tabs):
        def adapter():
            return _qknorm_adapter(q, k, config, **kw)
    return call(name, tensors, targets, kind, core, adapter,
                "cuprope.torch.rope_qk_norm(q, k, config, ...) (cos/sin tables must not "
                "require grad)", stream)


def qknorm_backward(name, q, k, grad_q, grad_k, config, kw, outs, stream, core):
    """``cuprope.qknorm.rope_qk_norm_backward``: not differentiable itself
    (TypeError under autograd); under torch.compile the custom op
    ``cuprope::rope_qk_norm_backward``."""
    targets, kind = _targets((grad_q, grad_k), outs, False)
    tensors = (q, k, grad_q, grad_k, kw.get("q_weight"), kw.get("k_weight"),
               *(kw.get("tables") or ()))
    adapter = None
    if not targets and not (torch.is_grad_enabled()
                            and any(_requires_grad(t) for t in tensors)):
        def adapter():
            return rope_qk_norm_backward_op(q, k, grad_q, grad_k, config, **kw)
    return call(name, tensors, targets, kind, core, adapter,
                "cuprope.torch.rope_qk_norm(q, k, config, ...) and .backward() (the explicit "
                "backward has no gradient of its own)", stream)


def no_adapter(name, tensors, targets, kind, core, instead):
    """A front end with no ``cuprope.torch`` adapter (LRPE, ggml's wrapper):
    TypeError under autograd, a graph break under torch.compile."""
    return call(name, tensors, targets, kind, core, None, instead)


def untraceable(core):
    """``core()`` (a front end that reads pointers before it reaches the core
    functions, such as ``cuprope.ggml.rope``): a graph break under
    torch.compile, else the call itself (whose core calls route as usual)."""
    if torch.compiler.is_compiling():
        return torch.compiler.disable(core)()
    return core()


def inference_op(name, tensors, written, core):
    """An inference op writing ``written`` in place (``cuprope.kvcache``'s
    append): TypeError under autograd (RuntimeError into a leaf that requires
    grad), a graph break under torch.compile."""
    return call(name, tensors, written, "inplace", core, None,
                "cuprope.torch.rope_qk for training (this is an inference op)")


def cos_sin_rotation(positions, query, key, head_size, cos_sin_cache, is_neox, stream, core):
    """``cuprope.cos_sin_cache.rotary_embedding`` (in place, an inference op):
    under torch.compile, without autograd, the custom op
    ``cuprope::rotary_embedding``; otherwise as ``inference_op``."""
    written = (query,) if key is None else (query, key)
    grad = torch.is_grad_enabled() and any(_requires_grad(t) for t in written)
    if torch.compiler.is_compiling() and stream is None and not grad:
        ctorch.rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)
        return query, key
    return inference_op("rotary_embedding", written, written, core)
