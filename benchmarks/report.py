"""Read the suite's one CSV (benchmarks/bench_suite.py), draw one figure per op
family and print Markdown: the targets of issue 25, each marked met / not met
from the data, and one table per family.

    python benchmarks/report.py [benchmarks/results.csv] [--figures DIR] [--no-tables]

Figures: ``DIR/<family>.png`` (default benchmarks/figures/). Needs matplotlib
for the figures only; no GPU. The notebook 04 calls the same functions.
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
    ("Decode prologue vs today's two cuprope launches (their µs / ours)",
     _peer("prologue", "cuprope-two-launches"), 1.3, ">=", ""),
    ("Decode prologue 16k prefill, fraction of copy",
     _frac("prologue", where=lambda k: k[1].startswith("prefill")), 0.85, ">=", ""),
    ("MLA append at or under FlashInfer (its µs / ours), every size",
     _peer_required("mla", "flashinfer"), 1.0, ">=", ""),
    ("MLA append vs the unfused torch sequence (its µs / ours)", _peer("mla", "unfused"), 2.0,
     ">=", ""),
    ("Plain RoPE at decode ≤ FlashInfer cos/sin cache (its µs / ours), B 1–1024",
     _peer_required("decode", "flashinfer-cos-sin-cache"), 1.0, ">=", ""),
    ("Host time per call of plain RoPE at decode (in place, rotary_embedding) / one torch mul_",
     _host, 1.3, "<=", ""),
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


US_FAMILIES = ("kv", "prologue", "mla", "decode", "startup", "models")


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
    ax.set_xlabel("host µs per call / one torch mul_ in the same loop")
    ax.legend(fontsize=7)
    fig.suptitle(f"cuprope host time on {', '.join(devices(fam))}", fontsize=10)
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=100)
        plt.close(fig)
    return fig


def draw_all(rows, outdir):
    """plot_family for every family present; returns the PNG paths."""
    os.makedirs(outdir, exist_ok=True)
    paths = []
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
                    help="folder for <family>.png ('' for none)")
    ap.add_argument("--no-tables", action="store_true", help="print the targets only")
    a = ap.parse_args(argv)
    rows = load(a.csv)
    if a.figures:
        for p in draw_all(rows, a.figures):
            print(f"wrote {p}", file=sys.stderr)
    print(targets_markdown(rows))
    if not a.no_tables:
        for fam in suite_rows.FAMILIES:
            if any(r["family"] == fam for r in rows):
                print(f"\n### {fam}\n\n{family_markdown(rows, fam)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
