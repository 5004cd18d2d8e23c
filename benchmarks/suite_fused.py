"""bench_suite's fused-op families: each calls its measuring module
(qknorm_bench, kvcache_bench, prologue_bench, mla_bench, decode_bench,
pdl_bench, host_overhead, jax_bench, jax_qknorm_bench) and turns what it returns into
suite_rows rows. ``ctx`` is bench_suite.Ctx (quick mode, case / dtype
filters, FlashInfer's lines)."""
import suite_rows

make = suite_rows.make


def qknorm(ctx):
    """Fused QK-norm + RoPE: raw fwd / bwd against copies of their bytes, and
    under torch autograd (forward; forward + backward) against torch.compile of
    HF's Qwen3 block, Liger and the unfused pair (ratio: peer µs / cuprope's)."""
    import qknorm_bench as qb
    shapes = ["qwen3"] if ctx.quick else ["llama", "qwen3"]
    reps = 10 if ctx.quick else 30
    rows = []
    for key in shapes:
        name, b, s, hq, hk, d = qb.SHAPES[key]
        if not ctx.want_case(name):
            continue
        shape = f"B {b} S {s} Hq {hq} Hk {hk} D {d}"
        for dt in ctx.dts(("bf16",) if ctx.quick else ("bf16", "fp16", "fp32")):
            t = qb.measure(b, s, hq, hk, d, qb.DTYPES[dt], reps=reps)
            for own in ("fwd", "bwd", "fwd_tab", "bwd_tab", "copy_f", "copy_b", "fused_f",
                        "fused_fb"):
                if own + "_error" in t:
                    raise RuntimeError(f"qknorm {name} {dt} {own}: {t[own + '_error']}")
            ev = f"CUDA events, median of {reps}"
            for op, sfx, nb in (("fwd", "f", t["bytes_f"]), ("bwd", "b", t["bytes_b"])):
                rows += [make("qknorm", op, name, dt, "copy", t["copy_" + sfx] * 1e6, shape=shape,
                              nbytes=nb, note=ev),
                         make("qknorm", op, name, dt, "cuprope", t[op] * 1e6, shape=shape,
                              nbytes=nb, note=ev + "; cuprope.qknorm raw call"),
                         make("qknorm", op + " hf-tables", name, dt, "copy",
                              t["copy_" + sfx] * 1e6, shape=shape, nbytes=nb, note=ev),
                         make("qknorm", op + " hf-tables", name, dt, "cuprope",
                              t[op + "_tab"] * 1e6, shape=shape, nbytes=nb,
                              note=ev + "; raw call with HF's cos/sin tables and Qwen3's "
                                        "rounding (what patch_hf runs)")]
            for op, sfx in (("fwd autograd", "_f"), ("fwd+bwd autograd", "_fb")):
                rows.append(make("qknorm", op, name, dt, "cuprope", t["fused" + sfx] * 1e6,
                                 shape=shape, note=ev + "; cuprope.torch.rope_qk_norm"))
                for impl, key2 in (("torch-compile", "hf"), ("unfused", "unf"), ("liger", "liger")):
                    if key2 + sfx in t:
                        rows.append(make("qknorm", op, name, dt, impl, t[key2 + sfx] * 1e6,
                                         shape=shape, ratio_to="cuprope", note=ev))
                    else:
                        ctx.note(f"qknorm {impl} not timed: "
                                 f"{t.get(key2 + sfx + '_error', 'not importable')}")
            ctx.progress(f"qknorm {name} {dt}")
    return rows


def kv(ctx):
    """RoPE + KV-cache append (kvcache_bench.run_case): cuprope, with the angle
    table, the unfused sequence, a copy; FlashInfer on the fp8 q+k+v mode."""
    import kvcache_bench as kb
    fi = kb.flashinfer_rows(ctx.fi_lines())
    modes = ("bf16", "fp8qkv") if ctx.quick else kb.MODES
    rows = []
    for kind, b, per_req in kb.CASES:
        case = _case_name(kind, b, per_req)
        if not ctx.want_case(case):
            continue
        shape = f"tokens {b * per_req} Hq {kb.HQ} Hk {kb.HK} D {kb.D} page {kb.PAGE}"
        for mode in modes:
            r = kb.run_case(kind, b, per_req, mode)
            g = "CUDA-graph replay of 50, median of 11"
            f = fi.get(r["tokens"]) if mode == "fp8qkv" else None
            fi_note = "" if f or mode != "fp8qkv" else ctx.fi_note()
            rows += [make("kv", "append", case, mode, "copy", r["copy_us"], shape=shape,
                          nbytes=r["bytes"], note=g),
                     make("kv", "append", case, mode, "cuprope", r["fused_us"], shape=shape,
                          nbytes=r["bytes"], note="; ".join(x for x in (g, fi_note) if x)),
                     make("kv", "append", case, mode, "cuprope-table", r["table_us"], shape=shape,
                          nbytes=r["bytes"], note=g + "; RopeConfig.cache_angles"),
                     make("kv", "append", case, mode, "unfused", r["unfused_us"], shape=shape,
                          ratio_to="cuprope", note=g + "; cuprope RoPE then torch index writes")]
            if f:
                rows.append(make("kv", "append", case, mode, "flashinfer", f["fused_us"],
                                 shape=shape, frac_copy=f["ratio"], nbytes=f["bytes"],
                                 ratio_to="cuprope", note="fi_bench_bin, own process and copy"))
        ctx.progress(f"kv {case}")
    return rows


def _case_name(kind, b, per_req):
    return f"decode B {b}" if kind == "decode" else f"prefill {per_req}"


def prologue(ctx):
    """The decode prologue in one launch (prologue_bench.run_case, fp8 q and
    cache): a copy of its bytes, today's two cuprope launches, the unfused
    chain (two torch rms_norm + rope_append_kv) and FlashInfer's fused append,
    which has no norm (ratio: peer µs / cuprope's)."""
    import kvcache_bench as kb
    import prologue_bench as pb
    fi = kb.flashinfer_rows(ctx.fi_lines())
    rows = []
    for kind, b, per_req in pb.CASES:
        case = _case_name(kind, b, per_req)
        if not ctx.want_case(case):
            continue
        shape = f"tokens {b * per_req} Hq {pb.HQ} Hk {pb.HK} D {pb.D} page {pb.PAGE}"
        r = pb.run_case(kind, b, per_req)
        g = "CUDA-graph replay of 50, median of 11"
        rows += [make("prologue", "norm+append", case, "fp8qkv", "copy", r["copy_us"], shape=shape,
                      nbytes=r["bytes"], note=g),
                 make("prologue", "norm+append", case, "fp8qkv", "cuprope", r["fused_us"],
                      shape=shape, nbytes=r["bytes"], note=g + "; qk_norm_rope_append_kv"),
                 make("prologue", "norm+append", case, "fp8qkv", "cuprope-two-launches",
                      r["two_launches_us"], shape=shape, ratio_to="cuprope",
                      note=g + "; rope_qk_norm_forward then rope_append_kv"),
                 make("prologue", "norm+append", case, "fp8qkv", "unfused", r["unfused_us"],
                      shape=shape, ratio_to="cuprope",
                      note=g + "; two torch rms_norm then rope_append_kv")]
        f = fi.get(r["tokens"])
        if f:
            rows.append(make("prologue", "norm+append", case, "fp8qkv", "flashinfer-no-norm",
                             f["fused_us"], shape=shape, ratio_to="cuprope",
                             note="fi_bench_bin RopeQuantizeAppendPagedKVCache (no norm)"))
        else:
            rows[-1]["note"] += "; " + ctx.fi_note()
        ctx.progress(f"prologue {case}")
    return rows


def mla(ctx):
    """DeepSeek MLA's RoPE + fp8 + paged latent-cache append
    (mla_bench.run_case): a copy of its bytes, the unfused torch sequence and
    FlashInfer's RopeQuantizeAppendPagedMLACache (ratio: peer µs / cuprope's)."""
    import mla_bench as mb
    fi = mb.flashinfer_mla_rows(ctx.fi_lines())
    rows = []
    for kind, b, per_req in mb.CASES:
        case = _case_name(kind, b, per_req)
        if not ctx.want_case(case):
            continue
        t = b * per_req
        shape = f"tokens {t} H {mb.H} R {mb.R} Dc {mb.N} page {mb.PAGE}"
        r = mb.run_case(kind, b, per_req)
        g = "CUDA-graph replay of 50, median of 11"
        rows += [make("mla", "rope+append", case, "fp8", "copy", r["copy_us"], shape=shape,
                      nbytes=r["bytes"], note=g),
                 make("mla", "rope+append", case, "fp8", "cuprope", r["fused_us"], shape=shape,
                      nbytes=r["bytes"], note=g + "; rope_append_mla"),
                 make("mla", "rope+append", case, "fp8", "unfused", r["unfused_us"], shape=shape,
                      ratio_to="cuprope", note=g + "; cuprope RoPE, torch fp8 casts and writes")]
        f = fi.get(t)
        if f:
            rows.append(make("mla", "rope+append", case, "fp8", "flashinfer", f["us"], shape=shape,
                             ratio_to="cuprope",
                             note="fi_bench_bin RopeQuantizeAppendPagedMLACache"))
        else:
            rows[-1]["note"] += "; " + ctx.fi_note()
        ctx.progress(f"mla {case}")
    return rows


def decode(ctx):
    """Plain RoPE in place at decode (decode_bench.measure): core, with the
    angle table, rotary_embedding from a cos/sin cache; FlashInfer's cos/sin-cache
    kernel in place and its computed-angle kernel (out of place)."""
    import decode_bench as db
    fi = db.flashinfer_decode(ctx.fi_lines())
    batches = [b for b in ((1, 64, 1024) if ctx.quick else db.BATCHES) if ctx.want_case(f"B {b}")]
    rows = []
    for r in db.measure(batches):
        case, b = f"B {r['B']}", r["B"]
        shape = f"B {b} S 1 Hq {db.HQ} Hk {db.HK} D {db.D}"
        g = "CUDA-graph replay of 50, median of 11"
        rows += [make("decode", "rope_qk in place", case, "bf16", impl, r[col], shape=shape,
                      nbytes=r["bytes"], note=g)
                 for impl, col in (("copy", "copy_us"), ("cuprope", "core_us"),
                                   ("cuprope-table", "core_table_us"),
                                   ("cuprope-rotary_embedding", "csc_us"))]
        f = fi.get(b)
        if f:
            rows += [make("decode", "rope_qk in place", case, "bf16", impl, f[col], shape=shape,
                          ratio_to="cuprope", nbytes=f["bytes"],
                          note="fi_bench_bin, own process, graph replay" + extra)
                     for impl, col, extra in (
                         ("flashinfer-cos-sin-cache", "cache_inplace_us", ""),
                         ("flashinfer", "computed_us", "; out of place"))]
        elif ctx.fi_lines():
            rows[-3]["note"] += f"; fi_bench_bin has no B {b} case"
        else:
            rows[-3]["note"] += "; " + ctx.fi_note()
    ctx.progress("decode")
    return rows


def pdl(ctx):
    """Programmatic dependent launch (pdl_bench.measure): µs per layer of a
    CUDA graph of L layers of [matmul writing q/k -> decode op], the op
    launched with enable_pdl, without it (ratio: its µs / with), and the
    matmuls alone."""
    import pdl_bench as pb
    batches = [b for b in pb.BATCHES if ctx.want_case(f"B {b}")]
    replays = 11 if ctx.quick else 31
    rows = []
    for r in pb.measure(batches=batches, layers=pb.LAYERS, replays=replays):
        case = f"B {r['B']}"
        shape = (f"B {r['B']} Hq {pb.HQ} Hk {pb.HK} D {pb.D}" if "mla" not in r["op"] else
                 f"T {r['B']} H {pb.MLA_H} R {pb.MLA_R} Dc {pb.MLA_DC}")
        g = (f"CUDA-graph replay of {r['layers']} layers [matmul (hidden {r['hidden']}) -> op], "
             f"median of {replays}, µs per layer")
        rows += [make("pdl", r["op"], case, "bf16", "cuprope-pdl", r["pdl_us"], shape=shape,
                      note=g + "; enable_pdl=True"),
                 make("pdl", r["op"], case, "bf16", "cuprope-no-pdl", r["plain_us"], shape=shape,
                      ratio_to="cuprope-pdl", note=g),
                 make("pdl", r["op"], case, "bf16", "matmul-only", r["matmul_us"], shape=shape,
                      note=g + "; the chain without the op")]
        ctx.progress(f"pdl {r['op']} {case}")
    return rows


def host(ctx):
    """Host µs per call (host_overhead.decode_rows, median of blocks of calls,
    rows interleaved) with its ratio to one torch eager mul_ in the same loop;
    each row's case is decode_rows' (B 8 Hq 32 Hk 8 D 128) but where
    host_overhead.ROW_CASES names another (MLA's own shapes)."""
    import statistics

    import host_overhead as ho
    calls, blocks = (500, 5) if ctx.quick else (2000, 9)
    named = ho.decode_rows()
    try:
        named += ho.cupy_rows()
    except ImportError:
        ctx.note("host: CuPy rows skipped (no cupy)")
    res = ho.measure(named, calls, blocks)
    ref = statistics.median(res[named[0][0]])
    rows = []
    for name, _ in named:
        med = statistics.median(res[name])
        impl = "torch-mul_" if "mul_" in name.split("(")[0] else "cuprope"
        dt = "fp32" if "fp32" in name else "bf16"
        case = getattr(ho, "ROW_CASES", {}).get(name, "B 8 Hq 32 Hk 8 D 128")
        rows.append(make("host", name, case, dt, impl, med, ratio=med / ref,
                         ratio_to="torch-mul_",
                         note=f"wall clock, median of {blocks} blocks of {calls} calls"))
    ctx.progress("host")
    return rows


def jax_calls(ctx):
    """cuprope.jax.rope_qk and rope_qk_norm under jax.jit against XLA's fusion
    of HF's formula, forward and value_and_grad (ratio: XLA µs / cuprope's)."""
    import jax_bench as jb
    import jax_qknorm_bench as jq
    short = {"bfloat16": "bf16", "float16": "fp16"}
    dts = [d for d in short if short[d] in ctx.dtypes] if ctx.dtypes else \
        ["bfloat16"] if ctx.quick else list(short)
    reps, rounds = (20, 5) if ctx.quick else (50, 9)
    hl = f"host loop of {reps} calls, median of {rounds}"
    hq = f"host loop of {reps // 2} calls, median of {rounds}"
    rows = []
    shapes = ("llama3-8b", "decode-b1", "decode-b64") if ctx.quick else tuple(jb.SHAPES)
    for dt in dts:
        for name in (s for s in shapes if ctx.want_case(s)):
            t = jb.measure(dt, name, reps=reps, rounds=rounds)
            for op, ours, xla in (("rope_qk fwd", "cuprope_jit_fwd", "xla_fwd"),
                                  ("rope_qk value_and_grad", "cuprope_jit_grad", "xla_grad")):
                rows += [make("jax", op, name, short[dt], "cuprope-jit", t[ours], note=hl),
                         make("jax", op, name, short[dt], "xla", t[xla], ratio_to="cuprope-jit",
                              note=hl)]
            rows.append(make("jax", "rope_qk fwd", name, short[dt], "cuprope-torch", t["torch_fwd"],
                             ratio_to="cuprope-jit", note=hl + "; the same kernel from torch"))
            ctx.progress(f"jax rope_qk {name} {dt}")
        for name in (s for s in jq.SHAPES if ctx.want_case(s)):
            t = jq.measure(name, dt, reps=reps // 2, rounds=rounds)
            for op, ours, xla in (("rope_qk_norm fwd", "ours", "xla"),
                                  ("rope_qk_norm value_and_grad", "ours_step", "xla_step")):
                rows += [make("jax", op, name, short[dt], "cuprope-jit", t[ours], note=hq),
                         make("jax", op, name, short[dt], "xla", t[xla], ratio_to="cuprope-jit",
                              note=hq)]
            ctx.progress(f"jax rope_qk_norm {name} {dt}")
    return rows
