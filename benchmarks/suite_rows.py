"""The one results CSV of benchmarks/bench_suite.py: its columns, how a row is
made, and how the file is written and read back (no GPU, no torch needed).

Columns (``COLUMNS``), one row per (family, op, case, dtype, impl):

* ``family``: the op family (``FAMILIES``; report.py draws one figure each);
* ``op``: what is timed inside the family (``qk_fwd``, ``fwd``, ``bwd``,
  ``append``, ...); ``case``: the named case (``llama3-8b``, ``B 64``, ...);
  ``shape``: its dimensions in words (``B 4 S 4096 Hq 32 Hk 8 D 128``);
* ``dtype``: the element type (``bf16``, ``fp16``, ``fp32``; ``fp8qkv`` style
  modes for the KV append);
* ``impl``: ``cuprope`` (and variants ``cuprope-table`` ...), ``copy`` (a
  device-to-device copy of the fewest bytes the op moves), or a peer:
  ``torch-compile``, ``torch-eager``, ``flashinfer``, ``liger``, ``xla``,
  ``unfused``, ``torch-mul_``;
* ``us``: median µs per call (empty where a legacy row had only a ratio);
* ``frac_copy``: the copy's µs over this row's (its bandwidth as a fraction of
  the copy's), where a copy of the same bytes was timed; a FlashInfer row
  carries the ratio to the copy timed in its own process;
* ``ratio`` / ``ratio_to``: this row's µs over the µs of the row of impl
  ``ratio_to`` in the same (family, op, case, dtype): a peer over cuprope
  (> 1: cuprope faster), a host time over one torch ``mul_``;
* ``bytes``: the bytes the op must move (where counted);
* ``device``: the GPU's name (every row); ``commit``: the code's commit;
* ``note``: how the row was timed, or why a peer is missing.
"""
import csv
import math
import os
import statistics
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout

COLUMNS = ("family", "op", "case", "shape", "dtype", "impl", "us", "frac_copy", "ratio",
           "ratio_to", "bytes", "device", "commit", "note")
FAMILIES = ("rotation", "schemes", "lrpe", "ggml", "qknorm", "kv", "prologue", "mla", "decode",
            "pdl", "host", "jax", "startup", "models")


def make(family, op, case, dtype, impl, us, *, shape="", frac_copy=None, ratio=None,
         ratio_to="", nbytes=None, note=""):
    """One row as a dict over COLUMNS (device and commit filled by ``finish``)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; one of {FAMILIES}")
    return {"family": family, "op": op, "case": case, "shape": shape, "dtype": dtype,
            "impl": impl, "us": us, "frac_copy": frac_copy, "ratio": ratio,
            "ratio_to": ratio_to, "bytes": nbytes, "device": "", "commit": "", "note": note}


def _key(r):
    return (r["family"], r["op"], r["case"], r["dtype"], r["device"])


def finish(rows, device=None, commit=None):
    """Fill device and commit (where given; else the rows keep theirs), frac_copy from the group's copy row (where the
    row has none of its own) and ratio from the row named by ratio_to. Returns
    the rows."""
    by = {}
    for r in rows:
        r["device"] = r["device"] if device is None else device
        r["commit"] = r["commit"] if commit is None else commit
        if _num(r["us"]) is not None:
            by.setdefault(_key(r), {})[r["impl"]] = _num(r["us"])
    for r in rows:
        us = _num(r["us"])
        grp = by.get(_key(r), {})
        if r["frac_copy"] is None and us and "copy" in grp and r["impl"] != "copy":
            r["frac_copy"] = grp["copy"] / us
        if r["impl"] == "copy" and r["frac_copy"] is None and us:
            r["frac_copy"] = 1.0
        if r["ratio"] is None and r["ratio_to"] and us and grp.get(r["ratio_to"]):
            r["ratio"] = us / grp[r["ratio_to"]]
    return rows


def _num(v):
    if v is None or v == "":
        return None
    x = float(v)
    return None if math.isnan(x) else x


def _fmt(v):
    if v is None:
        return ""
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.6g}" if abs(v) < 1e6 else f"{v:.0f}"
    return str(v)


def write(rows, path):
    """Write the rows (dicts over COLUMNS) to ``path``."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({c: _fmt(r.get(c)) for c in COLUMNS})


def read(path):
    """The rows of a results CSV, numbers as floats (None where empty). Raises
    ValueError if a column is missing or a row has no device."""
    with open(path, newline="") as f:
        rd = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (rd.fieldnames or ())]
        if missing:
            raise ValueError(f"{path}: columns {missing} missing (expected {COLUMNS})")
        rows = list(rd)
    for i, r in enumerate(rows):
        if not r["device"]:
            raise ValueError(f"{path}: row {i + 2} has no device name")
        if r["family"] not in FAMILIES:
            raise ValueError(f"{path}: row {i + 2}: unknown family {r['family']!r}")
        for c in ("us", "frac_copy", "ratio", "bytes"):
            r[c] = _num(r[c])
    return rows


def merge(paths):
    """The rows of suite CSVs of one device joined (a later file's rows replace
    an earlier file's rows of the same family). Raises ValueError if the files
    name different devices."""
    rows, devs = [], set()
    for p in paths:
        new = read(p)
        devs |= {r["device"] for r in new}
        fams = {r["family"] for r in new}
        rows = [r for r in rows if r["family"] not in fams] + new
    if len(devs) > 1:
        raise ValueError(f"the CSVs name different devices {sorted(devs)}")
    return rows


def combine(passes):
    """One row per (family, op, case, dtype, impl) from several passes of the
    same family (lists of rows, as the family returned them): us, frac_copy
    and ratio the median of the passes' values, the note extended by the
    passes' count and the spread of us (min–max, and max/min − 1 in %), so a
    committed figure says how far a rerun moved it. A row only some passes
    gave keeps those passes' values. Order: the first pass's, then rows that
    only later passes gave."""
    groups, order = {}, []
    for rows in passes:
        for r in rows:
            k = (r["family"], r["op"], r["case"], r["dtype"], r["impl"])
            if k not in groups:
                groups[k] = []
                order.append(k)
            groups[k].append(r)
    out = []
    for k in order:
        rs = groups[k]
        row = dict(rs[0])
        for c in ("us", "frac_copy", "ratio"):
            vals = [_num(r[c]) for r in rs if _num(r[c]) is not None]
            row[c] = statistics.median(vals) if vals else None
        us = [_num(r["us"]) for r in rs if _num(r["us"]) is not None]
        if len(rs) > 1 and us:
            spread = f"{min(us):.4g}–{max(us):.4g} µs" + (
                f", {100 * (max(us) / min(us) - 1):.1f} %" if min(us) > 0 else "")
            extra = f"median of {len(rs)} suite passes ({spread})"
            row["note"] = f"{row['note']}; {extra}" if row.get("note") else extra
        out.append(row)
    return out


def commit_id():
    """CUPROPE_COMMIT if set, else the checkout's short hash (+ '-dirty')."""
    if os.environ.get("CUPROPE_COMMIT"):
        return os.environ["CUPROPE_COMMIT"]
    try:
        top = subprocess.run(["git", "-C", ROOT, "rev-parse", "--show-toplevel"],
                             capture_output=True, text=True).stdout.strip()
        if os.path.realpath(top) != os.path.realpath(ROOT):
            return "unknown"
        h = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                           capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "-uno"],
                               capture_output=True, text=True).stdout.strip()
        return h + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
