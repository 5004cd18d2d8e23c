"""Draw benchmarks/results.png and print the README's markdown table from
benchmarks/results.csv (+ results_extra.json)."""
import csv
import json
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))


def load(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def table(rows):
    cases = []
    for r in rows:
        key = (r["case"], r["op"], r["dtype"])
        if key not in cases:
            cases.append(key)
    impls = ["cuprope", "cuprope-hf-tables", "torch-compile", "torch-eager"]
    out = ["| case | op | dtype | copy TB/s | " + " | ".join(f"{i} TB/s (/copy)" for i in impls) + " |",
           "| --- | --- | --- | --- | " + " | ".join("---" for _ in impls) + " |"]
    for c in cases:
        sel = {r["impl"]: r for r in rows if (r["case"], r["op"], r["dtype"]) == c}
        cells = []
        for i in impls:
            r = sel.get(i)
            cells.append(f"{float(r['TBps']):.2f} ({float(r['ratio_to_copy']):.3f})" if r else "–")
        out.append(f"| {c[0]} | {c[1]} | {c[2]} | {float(sel['copy']['TBps']):.2f} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sel = [r for r in rows if r["op"] in ("qk_fwd",) and r["impl"] != "copy"]
    labels = sorted({(r["case"], r["dtype"]) for r in sel})
    impls = sorted({r["impl"] for r in sel}, key=lambda s: (s != "cuprope", s))
    fig, ax = plt.subplots(figsize=(11, 4.5))
    w = 0.8 / max(1, len(impls))
    for k, impl in enumerate(impls):
        ys = []
        for lab in labels:
            m = [r for r in sel if (r["case"], r["dtype"]) == lab and r["impl"] == impl]
            ys.append(float(m[0]["ratio_to_copy"]) if m else 0.0)
        ax.bar([i + k * w for i in range(len(labels))], ys, w, label=impl)
    ax.axhline(1.0, color="k", lw=1, ls="--", label="device copy")
    ax.set_xticks([i + 0.4 - w / 2 for i in range(len(labels))])
    ax.set_xticklabels([f"{c}\n{d}" for c, d in labels], fontsize=8)
    ax.set_ylabel("bandwidth / copy bandwidth")
    ax.set_title(f"Fused q+k RoPE forward on {rows[0]['device']}")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "results.csv")
    rows = load(path)
    plot(rows, os.path.splitext(path)[0] + ".png")
    print(f"Device: {rows[0]['device']}\n")
    print(table(rows))
    extra = os.path.splitext(path)[0] + "_extra.json"
    if os.path.exists(extra):
        print("\n" + json.dumps(json.load(open(extra))))


if __name__ == "__main__":
    main()
