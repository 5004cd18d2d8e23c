"""The time a whole model spends in position encoding and q/k norm, from
``torch.profiler`` (models_bench's ``pos+norm`` rows).

What counts: the rotary embedding's cos/sin (the model's ``*RotaryEmbedding``
modules), every attention layer's q_norm / k_norm modules and the function the
attention calls to rotate q and k (transformers' ``apply_rotary_pos_emb``,
Liger's replacement of it, or the one ``cuprope.torch.patch_hf`` puts in the
layer's namespace). Each runs inside a ``record_function`` range
(:func:`ranges`); the forward time is the device time of the kernels launched
inside the ranges, the backward time that of the autograd nodes whose forward
op ran inside them (matched by sequence number and forward thread: the
profiler records both). With ``device=False`` (a CPU dry run) CPU time stands
in for device time.

Eager models only: under torch.compile inductor fuses these ops with their
neighbours, so no kernel is theirs alone.
"""
import contextlib
import sys

import torch
from torch.autograd.profiler import record_function

NAME = "models_bench::pos+norm"
_EVAL = "autograd::engine::evaluate_function: "


def _rotation_namespaces(model):
    """(namespace dict, global name) of the rotation each attention layer calls."""
    from cuprope.hfpatch.families import attention_of
    out = {}
    for m in model.modules():
        spec = attention_of(m)
        if spec is None:
            continue
        own = m.__dict__.get("_cuprope_hf_module")
        ns = sys.modules[own].__dict__ if own else sys.modules[type(m).__module__].__dict__
        out[id(ns)] = (ns, spec.rotation)
    return list(out.values())


def _norms(model):
    from cuprope.hfpatch.families import attention_of
    for m in model.modules():
        if attention_of(m) is not None:
            for name in ("q_norm", "k_norm", "qk_norm"):
                n = getattr(m, name, None)
                if isinstance(n, torch.nn.Module):
                    yield n


@contextlib.contextmanager
def ranges(model):
    """Every position-encoding and q/k-norm call of ``model`` inside a
    ``record_function`` range named NAME while the context is open."""
    stack, hooks, saved = [], [], []

    def enter(*_):
        r = record_function(NAME)
        r.__enter__()
        stack.append(r)

    def leave(*_):
        stack.pop().__exit__(None, None, None)

    mods = [m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")]
    for m in mods + list(_norms(model)):
        hooks += [m.register_forward_pre_hook(enter), m.register_forward_hook(leave)]
    for ns, name in _rotation_namespaces(model):
        fn = ns[name]

        def ranged(*args, _fn=fn, **kwargs):
            with record_function(NAME):
                return _fn(*args, **kwargs)
        saved.append((ns, name, fn))
        ns[name] = ranged
    try:
        yield
    finally:
        for h in hooks:
            h.remove()
        for ns, name, fn in saved:
            ns[name] = fn


def _time(e, device):
    return e.device_time_total if device else e.cpu_time_total


OURS = "cuprope::"  # in the name of every kernel cuprope launches


def _ours_linked(events):
    """Device µs of cuprope's kernels linked to ``events`` or their children."""
    total, stack = 0.0, list(events)
    while stack:
        e = stack.pop()
        total += sum(k.duration for k in e.kernels if OURS in k.name)
        stack.extend(e.cpu_children)
    return total


def unlinked_ours(events, counted):
    """Device µs of cuprope's kernels that the profiler linked to no event of
    ``counted`` (the ranges and the backward nodes): its links go through the
    CPU-side launch call, and some driver launches of cuprope's come without
    one. Every cuprope kernel in a patched model's step is the patch's (its
    rotation and norms), so these count as position encoding + q/k norm."""
    ours = sum(e.device_time for e in events
               if e.device_type == torch.autograd.DeviceType.CUDA and OURS in e.name)
    return max(0.0, ours - _ours_linked(counted))


def attribute(events, device=True):
    """(forward µs, backward µs, unlinked µs) spent in the ranges, from a
    profile's events (``prof.events()``): the ranges' own device time, that
    of the backward nodes their forward ops made, and cuprope's kernels the
    profiler linked to neither (``unlinked_ours``; 0 on a dry run)."""
    tops = [e for e in events if e.name == NAME]
    tops = [r for r in tops if not any(o is not r and o.thread == r.thread
                                       and o.time_range.start <= r.time_range.start
                                       and r.time_range.end <= o.time_range.end for o in tops)]
    fwd = sum(_time(r, device) for r in tops)
    by_thread = {}
    for r in tops:
        by_thread.setdefault(r.thread, []).append((r.time_range.start, r.time_range.end))
    seqs = set()
    for e in events:
        if e.sequence_nr < 0 or e.name.startswith(_EVAL) or e.name == NAME:
            continue
        for a, b in by_thread.get(e.thread, ()):
            if a <= e.time_range.start and e.time_range.end <= b:
                seqs.add((e.thread, e.sequence_nr))
                break
    nodes = [e for e in events
             if e.name.startswith(_EVAL) and (e.fwd_thread, e.sequence_nr) in seqs]
    bwd = sum(_time(e, device) for e in nodes)
    return fwd, bwd, unlinked_ours(events, tops + nodes) if device else 0.0


def profile_step(model, step, device=True, steps=1):
    """(forward µs, backward µs, unlinked µs) per call of ``step()`` in position
    encoding and q/k norm (:func:`attribute`), over ``steps`` profiled calls
    (after the caller's warm-up)."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device:
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with ranges(model), torch.profiler.profile(activities=acts) as prof:
        for _ in range(steps):
            step()
        if device:
            torch.cuda.synchronize()
    fwd, bwd, loose = attribute(prof.events(), device)
    return fwd / steps, bwd / steps, loose / steps
