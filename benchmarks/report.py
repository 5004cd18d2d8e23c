"""Read the suite's one CSV (benchmarks/bench_suite.py) and turn it into:

* the README's performance table (``readme_markdown``): per op, cuprope's µs
  and each peer's from the same run, the copy of the same bytes, the figure;
* ``TARGETS.md`` (``targets_file``): the project's performance targets, each
  marked met / not met from the data, and every row of every family;
* one figure per op family and a summary figure (``figures/``).

    python benchmarks/report.py [benchmarks/results.csv] [--figures DIR]
                                [--targets FILE] [--readme FILE]

Prints the README table; ``--readme README.md`` also rewrites it in place
(between the README_BEGIN / README_END markers). Needs matplotlib for the
figures only; no GPU. Notebook 04 calls the same functions.
"""
import argparse
import os
import sys
from collections import OrderedDict

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import suite_rows  # noqa: E402

DEFAULT_CSV = os.path.join(HERE, "results.csv")


def load(path=DEFAULT_CSV):
    """The CSV's rows (suite_rows.read: schema checked, numbers as floats)."""
    return suite_rows.read(path)


def _groups(rows, family, op=None):
    """{(op, case, dtype, device): {impl: row}} of one family (one op if given)."""
    out = OrderedDict()
    for r in rows:
        if r["family"] == family and (op is None or r["op"] == op):
            out.setdefault((r["op"], r["case"], r["dtype"], r["device"]), {})[r["impl"]] = r
    return out


def peer_over_ours(g, peer, ours="cuprope"):
    """The peer's µs over ours in one group: from the two µs, else from the
    peer row's ratio when it was stated against ``ours``; None if neither."""
    p, o = g.get(peer), g.get(ours)
    if p is None or o is None:
        return None
    if p["us"] and o["us"]:
        return p["us"] / o["us"]
    if p["ratio"] is not None and p["ratio_to"] == ours:
        return p["ratio"]
    return None


def _label(key):
    op, case, dtype, _ = key
    return f"{case} {dtype} ({op})"


def _frac(family, op=None, impl="cuprope", where=lambda k: True):
    def values(rows):
        return [(_label(k), g[impl]["frac_copy"]) for k, g in _groups(rows, family, op).items()
                if impl in g and where(k)]
    return values


def _peer(family, peer, op=None, ours="cuprope", where=lambda k: True):
    def values(rows):
        return [(_label(k), peer_over_ours(g, peer, ours))
                for k, g in _groups(rows, family, op).items() if ours in g and where(k)
                and peer in g]
    return values


def _peer_required(family, peer, op=None, ours="cuprope", where=lambda k: True):
    """Like _peer, but a group with cuprope and no peer row counts as missing (None)."""
    def values(rows):
        return [(_label(k), peer_over_ours(g, peer, ours) if peer in g else None)
                for k, g in _groups(rows, family, op).items() if ours in g and where(k)]
    return values


def _host(rows):
    """The plain RoPE calls at decode (rope_qk_forward in place, rotary_embedding)."""
    return [(r["op"], r["ratio"]) for r in rows if r["family"] == "host" and r["impl"] == "cuprope"
            and ("rope_qk_forward in place" in r["op"] or "rotary_embedding" in r["op"])]


# host_overhead's rows of the ops that write a cache
HOST_FUSED = ("kv append", "prologue", "rope_append_mla")


def _host_fused(rows):
    """The KV append, the decode prologue and MLA's append at decode."""
    return [(r["op"], r["ratio"]) for r in rows if r["family"] == "host" and r["impl"] == "cuprope"
            and r["op"].startswith(HOST_FUSED)]


def _decode(k):
    return k[1].startswith("decode")


# (text, values(rows) -> [(label, value or None)], target, ">=" or "<=", note)
TARGETS = [
    ("QK-norm + RoPE forward, fraction of copy", _frac("qknorm", "fwd"), 0.90, ">=", ""),
    ("QK-norm + RoPE backward, fraction of copy", _frac("qknorm", "bwd"), 0.85, ">=", ""),
    ("QK-norm + RoPE forward vs torch.compile (its µs / ours)",
     _peer("qknorm", "torch-compile", "fwd autograd"), 1.2, ">=", ""),
    ("QK-norm + RoPE fwd+bwd vs torch.compile (its µs / ours)",
     _peer("qknorm", "torch-compile", "fwd+bwd autograd"), 1.2, ">=", ""),
    ("KV append at decode ≤ FlashInfer (FlashInfer µs / ours), fp8 q+k+v, every B",
     _peer_required("kv", "flashinfer", where=lambda k: _decode(k) and k[2] == "fp8qkv"), 1.0,
     ">=", "bf16 append: fi_bench_bin has no bf16 case"),
    ("KV append 16k prefill, fraction of copy",
     _frac("kv", where=lambda k: k[1].startswith("prefill")), 0.85, ">=", ""),
    ("KV append 16k prefill vs FlashInfer (its µs / ours)",
     _peer_required("kv", "flashinfer", where=lambda k: k[1].startswith("prefill")
                    and k[2] == "fp8qkv"), 1.3, ">=", ""),
    ("Decode prologue within 1.1× FlashInfer's append without a norm (its µs / ours), every B",
     _peer_required("prologue", "flashinfer-no-norm", where=_decode), 0.91, ">=",
     ""),
    ("Decode prologue vs the unfused chain (its µs / ours)",
     _peer("prologue", "unfused"), 2.0, ">=", ""),
    ("Decode prologue vs two separate cuprope launches (their µs / ours)",
     _peer("prologue", "cuprope-two-launches"), 1.3, ">=", ""),
    ("Decode prologue 16k prefill, fraction of copy",
     _frac("prologue", where=lambda k: k[1].startswith("prefill")), 0.85, ">=", ""),
    ("MLA append at or under FlashInfer (its µs / ours), every size",
     _peer_required("mla", "flashinfer"), 1.0, ">=", ""),
    ("MLA append vs the unfused torch sequence (its µs / ours)", _peer("mla", "unfused"), 2.0,
     ">=", ""),
    ("Plain RoPE at decode ≤ FlashInfer cos/sin cache (its µs / ours), B 1–1024",
     _peer_required("decode", "flashinfer-cos-sin-cache"), 1.0, ">=", ""),
    ("Programmatic dependent launch: [matmul → op] graph µs per layer without enable_pdl / with, "
     "every decode op and B", _peer_required("pdl", "cuprope-no-pdl", ours="cuprope-pdl"), 1.0,
     ">=", "above 1: PDL faster"),
    ("Host time per call of plain RoPE at decode (in place, rotary_embedding) / one torch mul_",
     _host, 1.3, "<=", ""),
    ("Host time per call of the KV append, the prologue and MLA at decode / one torch mul_",
     _host_fused, 1.5, "<=", ""),
    ("Rotation, fraction of copy (every op and shape)", _frac("rotation"), 0.97, ">=", ""),
    ("Rotation vs torch.compile (its µs / ours)", _peer("rotation", "torch-compile"), 1.05, ">=",
     ""),
    ("Under jax.jit vs XLA's fusion (its µs / ours), fwd and value_and_grad",
     _peer("jax", "xla", ours="cuprope-jit"), 1.1, ">=", ""),
    ("Models: position encoding + q/k norm per step, HF eager's µs / patched (≤ 1/3 of HF's)",
     _peer_required("models", "hf", where=lambda k: k[0].endswith("pos+norm")), 3.0, ">=",
     "training and decode"),
    ("Models: position encoding + q/k norm per step, Liger RoPE-only's µs / patched",
     _peer_required("models", "liger-rope", where=lambda k: k[0].endswith("pos+norm")), 1.0,
     ">=", "training and decode"),
    ("Models: whole step, unpatched µs / patched (never below unpatched), eager",
     _peer("models", "hf", where=lambda k: not k[0].endswith("pos+norm")), 1.0, ">=", ""),
    ("Models: whole step, unpatched µs / patched, both under torch.compile",
     _peer("models", "hf-compile", ours="cuprope-compile"), 1.0, ">=", ""),
]


def evaluate(rows):
    """[{target, status, met, n, missing, worst, value, note}] for TARGETS.
    status: met (every row), not met (a row misses), incomplete (no row misses
    but one lacks its peer), no data."""
    out = []
    for text, values, target, op, note in TARGETS:
        vals = values(rows)
        have = [(lab, v) for lab, v in vals if v is not None]
        missing = len(vals) - len(have)
        ok = [(v >= target) if op == ">=" else (v <= target) for _, v in have]
        worst = None
        if have:
            worst = (min if op == ">=" else max)(have, key=lambda t: t[1])
        status = ("no data" if not have else "not met" if not all(ok)
                  else "incomplete" if missing else "met")
        out.append(dict(target=f"{text} {op} {target}", status=status, met=sum(ok), n=len(have),
                        missing=missing, worst=worst[0] if worst else "",
                        value=worst[1] if worst else None, note=note))
    return out


def devices(rows):
    return sorted({r["device"] for r in rows})


def targets_markdown(rows):
    """The targets table (Markdown), each marked from the data."""
    lines = [f"Device: {', '.join(devices(rows))}; commit: "
             f"{', '.join(sorted({r['commit'] for r in rows}))}", "",
             "| target | status | rows met | worst row | value |", "| --- | --- | --- | --- | --- |"]
    for e in evaluate(rows):
        miss = f" ({e['missing']} without a peer row)" if e["missing"] else ""
        note = f" ({e['note']})" if e["note"] else ""
        val = f"{e['value']:.3f}" if e["value"] is not None else "–"
        lines.append(f"| {e['target']}{note} | **{e['status']}** | {e['met']} of {e['n']}{miss} | "
                     f"{e['worst'] or '–'} | {val} |")
    return "\n".join(lines)


def family_markdown(rows, family):
    """One family's rows as a Markdown table: µs (fraction of copy) per impl."""
    groups = _groups(rows, family)
    impls = list(OrderedDict.fromkeys(r["impl"] for r in rows if r["family"] == family))
    head = "| op | case | dtype | " + " | ".join(impls) + " |"
    lines = [head, "|" + " --- |" * (3 + len(impls))]
    for (op, case, dt, _), g in groups.items():
        cells = []
        for i in impls:
            r = g.get(i)
            if r is None:
                cells.append("–")
                continue
            us = f"{r['us']:.4g} µs" if r["us"] is not None else "–"
            extra = (f" ({r['frac_copy']:.3f} of copy)" if r["frac_copy"] is not None and i != "copy"
                     else f" ({r['ratio']:.2f}× {r['ratio_to']})" if r["ratio"] is not None
                     else "")
            cells.append(us + extra)
        lines.append(f"| {op} | {case} | {dt} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------ README table
# One row per op a user picks between: the cases it is timed at (one cell value
# each, joined by " / "), cuprope's impl, the peers timed beside it in the same
# process, and the figure(s) holding every row.
DT3 = ("bf16", "fp16", "fp32")
ROT_PEERS = (("torch.compile of HF's formula", "torch-compile"), ("Liger", "liger"),
             ("FlashInfer", "flashinfer"), ("FlashInfer, cos/sin cache", "flashinfer-cos-sin-cache"),
             ("torch eager, HF's formula", "torch-eager"))
APPEND_SIZES = ("decode B 1", "decode B 64", "decode B 256", "decode B 1024", "prefill 16384")
DECODE_SIZES = ("B 1", "B 64", "B 256", "B 512", "B 1024")
HOST_OPS = ("rope_qk_forward in place, positions int32 [B,1]",
            "cuprope.torch.rotary_embedding (qkv slices)", "kv append fp8 (device scales), paged")


def _keys(family, op, cases, dtypes, impl="cuprope"):
    """[(family, op, case, dtype, impl)] over cases × dtypes."""
    return [(family, op, c, d, impl) for c in cases for d in dtypes]


README_ROWS = [
    dict(op="RoPE on q and k, forward (`rope_qk_forward`)",
         sizes="Llama-3-8B prefill, bf16 / fp16 / fp32",
         keys=_keys("rotation", "qk_fwd", ["llama3-8b"], DT3), peers=ROT_PEERS,
         figures=("rotation",)),
    dict(op="RoPE on q and k, forward (`rope_qk_forward`)",
         sizes="bf16: S 32k / D 64 (MHA) / D 256",
         keys=_keys("rotation", "qk_fwd", ["seq32k", "mha-d64", "d256"], ["bf16"]),
         peers=ROT_PEERS, figures=("rotation",)),
    dict(op="RoPE on q and k, backward (`rope_qk_backward`)",
         sizes="Llama-3-8B prefill, bf16 / fp16 / fp32",
         keys=_keys("rotation", "qk_bwd", ["llama3-8b"], DT3), peers=(), figures=("rotation",)),
    dict(op="RoPE on q and k, in place (`inplace=True`)",
         sizes="Llama-3-8B prefill, bf16 / fp16 / fp32",
         keys=_keys("rotation", "qk_inplace", ["llama3-8b"], DT3), peers=(),
         figures=("rotation",)),
    dict(op="HF drop-in (`cuprope.torch.apply_rotary_pos_emb`)",
         sizes="Llama-3-8B prefill, bf16 / fp16 / fp32",
         keys=_keys("rotation", "qk_fwd", ["llama3-8b"], DT3, "cuprope-hf-tables"),
         peers=(("torch.compile of HF's formula", "torch-compile"),
                ("torch eager, HF's formula", "torch-eager")), figures=("rotation",)),
    dict(op="Other frequency schemes and ops, forward",
         sizes="Llama-3-8B prefill, bf16: YaRN / Qwen2-VL MRoPE / LRPE with SiLU / "
               "ggml NEOX (q only)",
         keys=[("schemes", "yarn", "llama3-8b", "bf16", "cuprope"),
               ("schemes", "mrope", "llama3-8b", "bf16", "cuprope"),
               ("lrpe", "lrpe_silu", "llama3-8b", "bf16", "cuprope"),
               ("ggml", "rope", "llama3-8b q", "bf16", "cuprope-neox")],
         peers=(), figures=("schemes", "lrpe", "ggml")),
    dict(op="QK-norm + RoPE forward, autograd (`cuprope.torch.rope_qk_norm`)",
         sizes="Qwen3-8B prefill, bf16 / fp16 / fp32",
         keys=_keys("qknorm", "fwd autograd", ["Qwen3-8B prefill"], DT3),
         peers=(("torch.compile of HF's norm + RoPE", "torch-compile"), ("Liger", "liger"),
                ("torch RMSNorm + cuprope RoPE", "unfused")), figures=("qknorm",)),
    dict(op="QK-norm + RoPE forward + backward, autograd",
         sizes="Qwen3-8B prefill, bf16 / fp16 / fp32",
         keys=_keys("qknorm", "fwd+bwd autograd", ["Qwen3-8B prefill"], DT3),
         peers=(("torch.compile of HF's norm + RoPE", "torch-compile"), ("Liger", "liger"),
                ("torch RMSNorm + cuprope RoPE", "unfused")), figures=("qknorm",)),
    dict(op="RoPE + fp8 paged KV-cache append (`kvcache.rope_append_kv`)",
         sizes="fp8 q, k, v; decode B 1 / 64 / 256 / 1024 / prefill 16k",
         keys=_keys("kv", "append", APPEND_SIZES, ["fp8qkv"]),
         peers=(("FlashInfer", "flashinfer"), ("cuprope RoPE, then torch's fp8 casts and writes",
                                               "unfused")), figures=("kv",)),
    dict(op="the same with `cfg.cache_angles(n)`",
         sizes="fp8 q, k, v; decode B 1 / 64 / 256 / 1024 / prefill 16k",
         keys=_keys("kv", "append", APPEND_SIZES, ["fp8qkv"], "cuprope-table"),
         peers=(("FlashInfer", "flashinfer"),), figures=("kv",)),
    dict(op="QK-norm + RoPE + fp8 + KV append, one launch (`prologue.qk_norm_rope_append_kv`)",
         sizes="fp8 q, k, v; decode B 1 / 64 / 256 / 1024 / prefill 16k",
         keys=_keys("prologue", "norm+append", APPEND_SIZES, ["fp8qkv"]),
         peers=(("FlashInfer's append, which has no norm", "flashinfer-no-norm"),
                ("`rope_qk_norm_forward` then `rope_append_kv`", "cuprope-two-launches"),
                ("two torch `rms_norm`, then `rope_append_kv`", "unfused")),
         figures=("prologue",)),
    dict(op="DeepSeek MLA RoPE + fp8 + paged latent cache (`mla.rope_append_mla`)",
         sizes="fp8; T 1 / 64 / 256 / 1024 / prefill 16k",
         keys=_keys("mla", "rope+append", APPEND_SIZES, ["fp8"]),
         peers=(("FlashInfer", "flashinfer"), ("cuprope RoPE, then torch's fp8 casts and writes",
                                               "unfused")), figures=("mla",)),
    dict(op="RoPE in place at decode (`rope_qk_forward(..., inplace=True)`)",
         sizes="bf16; B 1 / 64 / 256 / 512 / 1024, one token each",
         keys=_keys("decode", "rope_qk in place", DECODE_SIZES, ["bf16"]),
         peers=(("FlashInfer, cos/sin cache", "flashinfer-cos-sin-cache"),
                ("FlashInfer, angles computed, out of place", "flashinfer")),
         figures=("decode",)),
    dict(op="vLLM's op (`cuprope.torch.rotary_embedding`)",
         sizes="bf16; B 1 / 64 / 256 / 512 / 1024, one token each",
         keys=_keys("decode", "rope_qk in place", DECODE_SIZES, ["bf16"],
                    "cuprope-rotary_embedding"),
         peers=(("FlashInfer, cos/sin cache", "flashinfer-cos-sin-cache"),),
         figures=("decode",)),
    dict(op="`cuprope.jax.rope_qk` under `jax.jit`, forward",
         sizes="bf16: Llama-3-8B prefill / S 32k / decode B 1 / decode B 64",
         keys=_keys("jax", "rope_qk fwd", ["llama3-8b", "32k", "decode-b1", "decode-b64"],
                    ["bf16"], "cuprope-jit"),
         peers=(("XLA's fusion of HF's formula", "xla"),), figures=("jax",)),
    dict(op="`cuprope.jax.rope_qk` under `jax.jit`, `value_and_grad`",
         sizes="bf16: Llama-3-8B prefill / S 32k / decode B 1 / decode B 64",
         keys=_keys("jax", "rope_qk value_and_grad",
                    ["llama3-8b", "32k", "decode-b1", "decode-b64"], ["bf16"], "cuprope-jit"),
         peers=(("XLA's fusion of HF's formula", "xla"),), figures=("jax",)),
    dict(op="`cuprope.jax.rope_qk_norm` under `jax.jit`, forward / `value_and_grad`",
         sizes="bf16, Qwen3-8B prefill: forward / value_and_grad",
         keys=[("jax", "rope_qk_norm fwd", "qwen3-8b prefill", "bf16", "cuprope-jit"),
               ("jax", "rope_qk_norm value_and_grad", "qwen3-8b prefill", "bf16",
                "cuprope-jit")],
         peers=(("XLA's fusion of HF's norm + RoPE", "xla"),), figures=("jax",)),
    dict(op="host time per call at decode, torch tensors",
         sizes="B 8: `rope_qk_forward` in place / `cuprope.torch.rotary_embedding` / "
               "`rope_append_kv` fp8 paged",
         keys=[("host", op, "B 8 Hq 32 Hk 8 D 128", "bf16", "cuprope") for op in HOST_OPS],
         peers=(("one torch eager `mul_` in the same loop", "torch-mul_",
                 [("host", "torch mul_ (one eager op)", "B 8 Hq 32 Hk 8 D 128", "bf16",
                   "torch-mul_")]),), figures=("host",)),
]


def _us(v):
    """µs for a table cell: three significant digits or more; '–' for none."""
    if v is None:
        return "–"
    return f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 else f"{v:.0f}"


def _cells(index, keys):
    return [index[k]["us"] if k in index else None for k in keys]


def readme_rows(rows):
    """README_ROWS with their values: [{op, sizes, ours, copy, peers, figures}],
    ours/copy lists of µs (None where a case has no row), peers
    [(name, impl, [µs...])] without the peers of no row at all."""
    index = {(r["family"], r["op"], r["case"], r["dtype"], r["impl"]): r for r in rows}
    out = []
    for spec in README_ROWS:
        keys = spec["keys"]
        copy = _cells(index, [k[:4] + ("copy",) for k in keys])
        peers = []
        for p in spec["peers"]:
            name, impl = p[0], p[1]
            pk = p[2] if len(p) > 2 else [k[:4] + (impl,) for k in keys]
            vals = _cells(index, pk)
            if any(v is not None for v in vals):
                peers.append((name, impl, vals))
        out.append(dict(op=spec["op"], sizes=spec["sizes"], ours=_cells(index, keys), copy=copy,
                        peers=peers, figures=spec["figures"]))
    return out


def readme_markdown(rows, figures="benchmarks/figures"):
    """The README's performance table (Markdown): per op, cuprope's µs, a copy
    of the same bytes, and each peer's µs, then the device the rows name."""
    lines = ["| op | sizes | cuprope µs | copy µs | peers in the same process, µs | figure |",
             "| --- | --- | --- | --- | --- | --- |"]
    for e in readme_rows(rows):
        ours = " / ".join(_us(v) for v in e["ours"])
        copy = " / ".join(_us(v) for v in e["copy"]) if any(e["copy"]) else "–"
        peers = "<br>".join(f"{n}: {' / '.join(_us(v) for v in vals)}"
                            for n, _, vals in e["peers"])
        figs = ", ".join(f"[{f}]({figures}/{f}.png)" for f in e["figures"])
        lines.append(f"| {e['op']} | {e['sizes']} | {ours} | {copy} | {peers or '–'} | {figs} |")
    used = {k[:4] for s in README_ROWS for k in s["keys"]}
    devs = sorted({r["device"] for r in rows if (r["family"], r["op"], r["case"], r["dtype"])
                   in used})
    lines += ["", f"Every number above: {', '.join(devs)}; each row's peers timed in the same "
                  "process; µs per call, the median of many."]
    return "\n".join(lines)


README_BEGIN = "<!-- performance table: python benchmarks/report.py --readme README.md -->"
README_END = "<!-- end of the performance table -->"


def update_readme(rows, path):
    """Replace the text between README_BEGIN and README_END in ``path`` with
    readme_markdown(rows). ValueError when the markers are missing."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    a, b = text.find(README_BEGIN), text.find(README_END)
    if a < 0 or b < a:
        raise ValueError(f"{path}: no {README_BEGIN!r} ... {README_END!r} markers")
    text = text[:a + len(README_BEGIN)] + "\n" + readme_markdown(rows) + "\n" + text[b:]
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def targets_file(rows):
    """TARGETS.md: the targets, each marked from the data, then every family's rows."""
    parts = ["# Performance targets and every benchmark row", "",
             "Generated by `python benchmarks/report.py` from `benchmarks/results.csv`; "
             "`NOTES.md` says what bounds each target and what was tried.", "",
             "## Targets", "",
             "Each target is checked on every row it concerns; *worst row* is the one furthest "
             "from the bound; *incomplete*: no row misses, but some lack the peer they are "
             "compared with.", "", targets_markdown(rows), "", "## Every row, by family"]
    for fam in suite_rows.FAMILIES:
        if any(r["family"] == fam for r in rows):
            parts += ["", f"### {fam}", "", family_markdown(rows, fam)]
    return "\n".join(parts) + "\n"


US_FAMILIES = ("kv", "prologue", "mla", "decode", "pdl", "startup", "models")


def _metric(family, op_rows):
    """(column, axis label, reference line) of one panel."""
    if family == "host":
        return "ratio", "host µs / one torch mul_", 1.3
    if family not in US_FAMILIES and any(r["impl"] == "copy" for r in op_rows):
        return "frac_copy", "bandwidth / copy", 1.0
    if family not in US_FAMILIES and any(r["ratio"] is not None for r in op_rows):
        return "ratio", "peer µs / cuprope µs (> 1: cuprope faster)", 1.0
    return "us", "µs per call", None


def plot_family(rows, family, path=None):
    """One figure for ``family``: a panel per op, bars per impl over (case,
    dtype). Saves to ``path`` when given; returns the figure."""
    import matplotlib
    if path:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fam = [r for r in rows if r["family"] == family]
    if family == "host":
        return _plot_host(fam, path, plt)
    ops = list(OrderedDict.fromkeys(r["op"] for r in fam))
    by_op = {op: [r for r in fam if r["op"] == op] for op in ops}
    fig, axes = plt.subplots(len(ops), 1, figsize=(12, 3.2 * len(ops)), squeeze=False)
    for ax, op in zip(axes[:, 0], ops):
        sel = by_op[op]
        col, ylabel, line = _metric(family, sel)
        labels = list(OrderedDict.fromkeys((r["case"], r["dtype"]) for r in sel))
        impls = [i for i in OrderedDict.fromkeys(r["impl"] for r in sel)
                 if not (col == "frac_copy" and i == "copy")
                 and not (col == "ratio" and all(r[col] is None for r in sel if r["impl"] == i))]
        w = 0.8 / max(1, len(impls))
        for j, impl in enumerate(impls):
            ys = []
            for lab in labels:
                m = [r for r in sel if (r["case"], r["dtype"]) == lab and r["impl"] == impl]
                ys.append(m[0][col] if m and m[0][col] is not None else float("nan"))
            ax.bar([i + j * w for i in range(len(labels))], ys, w, label=impl)
        if line:
            ax.axhline(line, color="k", lw=1, ls="--",
                       label={"frac_copy": "copy", "ratio": "cuprope" if family != "host"
                              else "target"}.get(col, ""))
        if col == "us" and family != "startup":
            ax.set_yscale("log")
        ax.set_xticks([i + 0.4 - w / 2 for i in range(len(labels))])
        ax.set_xticklabels([f"{c}\n{d}" if len(c) < 22 else f"{c[:40]}\n{d}" for c, d in labels],
                           fontsize=7, rotation=0 if len(labels) < 9 else 30, ha="center")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{family}: {op}", fontsize=10)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(f"cuprope {family} on {', '.join(devices(fam))}", fontsize=11)
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=100)
        plt.close(fig)
    return fig


def _plot_host(fam, path, plt):
    """Host time: one horizontal bar per timed call, its ratio to one torch mul_."""
    fam = [r for r in fam if r["ratio"] is not None]
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(fam) + 1.5))
    ys = range(len(fam))
    ax.barh(list(ys), [r["ratio"] for r in fam],
            color=["C7" if r["impl"] == "torch-mul_" else "C0" for r in fam])
    ax.set_yticks(list(ys))
    ax.set_yticklabels([f"{r['op']} ({r['dtype']})" for r in fam], fontsize=7)
    ax.invert_yaxis()
    ax.axvline(1.3, color="k", ls="--", lw=1, label="target 1.3× mul_ (plain RoPE calls)")
    ax.axvline(1.5, color="k", ls=":", lw=1,
               label="target 1.5× mul_ (KV append, prologue, MLA)")
    ax.set_xlabel("host µs per call / one torch mul_ in the same loop")
    ax.legend(fontsize=7)
    fig.suptitle(f"cuprope host time on {', '.join(devices(fam))}", fontsize=10)
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=100)
        plt.close(fig)
    return fig


def _plain(text):
    return text.replace("`", "")


# the summary figure's colour and legend entry per impl
SUMMARY_IMPLS = OrderedDict([
    ("copy", "copy of the same bytes"), ("torch-compile", "torch.compile"), ("liger", "Liger"),
    ("flashinfer", "FlashInfer"), ("flashinfer-cos-sin-cache", "FlashInfer, cos/sin cache"),
    ("flashinfer-no-norm", "FlashInfer's append (no norm)"), ("xla", "XLA under jax.jit"),
    ("torch-eager", "torch eager"), ("unfused", "the unfused sequence"),
    ("cuprope-two-launches", "two cuprope launches")])


def plot_summary(rows, path=None):
    """The README's figure: per README row with a peer, at its first size, the
    copy's and each peer's µs over cuprope's, on a log axis (> 1: cuprope faster)."""
    import matplotlib
    if path:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    entries = []
    for e in readme_rows(rows):
        bars = ([("copy", e["copy"][0])] if e["copy"][0] else []) + \
            [(impl, v[0]) for _, impl, v in e["peers"] if v[0] and impl in SUMMARY_IMPLS]
        if e["ours"][0] and len(bars) > (1 if e["copy"][0] else 0):
            entries.append((e, bars))
    colors = {impl: "0.65" if i == 0 else plt.cm.tab10(i - 1)
              for i, impl in enumerate(SUMMARY_IMPLS)}
    n_bars = sum(len(b) for _, b in entries)
    fig, ax = plt.subplots(figsize=(10, 0.22 * n_bars + 0.35 * len(entries) + 1.2))
    y, ticks, labels, seen = 0.0, [], [], set()
    for e, bars in entries:
        top = y
        for impl, v in bars:
            ax.barh(y, v / e["ours"][0], 0.85, color=colors[impl],
                    label=None if impl in seen else SUMMARY_IMPLS[impl])
            seen.add(impl)
            y += 1
        ticks.append((top + y - 1) / 2)
        labels.append(f"{_plain(e['op'])}\n{_plain(e['sizes'].split(' / ')[0])}")
        y += 0.7
    ax.axvline(1.0, color="k", lw=1, ls="--", label="cuprope")
    ax.set_xscale("log")
    ax.set_ylim(y - 0.5, -0.7)
    ax.set_yticks(ticks)
    ax.set_yticklabels(labels, fontsize=7)
    ax.set_xlabel("µs per call over cuprope's (> 1: cuprope faster; the copy is the floor)")
    handles, names = ax.get_legend_handles_labels()
    order = ["cuprope"] + [SUMMARY_IMPLS[i] for i in SUMMARY_IMPLS if i in seen]
    ax.legend([handles[names.index(n)] for n in order], order, fontsize=7, loc="lower right")
    ax.set_title(f"cuprope against its peers on {', '.join(devices(rows))}\n"
                 "(each op at the first size of its README row)", fontsize=10)
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=100)
        plt.close(fig)
    return fig


def draw_all(rows, outdir):
    """plot_family for every family present, and plot_summary; returns the PNG paths."""
    os.makedirs(outdir, exist_ok=True)
    paths = []
    p = os.path.join(outdir, "summary.png")
    plot_summary(rows, p)
    paths.append(p)
    for fam in suite_rows.FAMILIES:
        if any(r["family"] == fam for r in rows):
            p = os.path.join(outdir, f"{fam}.png")
            plot_family(rows, fam, p)
            paths.append(p)
    return paths


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="?", default=DEFAULT_CSV)
    ap.add_argument("--figures", default=os.path.join(HERE, "figures"),
                    help="folder for <family>.png and summary.png ('' for none)")
    ap.add_argument("--targets", default=os.path.join(HERE, "TARGETS.md"),
                    help="file for the targets and every row ('' for none)")
    ap.add_argument("--readme", default="",
                    help="a README whose performance table to rewrite in place")
    a = ap.parse_args(argv)
    rows = load(a.csv)
    if a.figures:
        for p in draw_all(rows, a.figures):
            print(f"wrote {p}", file=sys.stderr)
    if a.targets:
        with open(a.targets, "w", encoding="utf-8") as f:
            f.write(targets_file(rows))
        print(f"wrote {a.targets}", file=sys.stderr)
    if a.readme:
        update_readme(rows, a.readme)
        print(f"rewrote the performance table of {a.readme}", file=sys.stderr)
    print(readme_markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
