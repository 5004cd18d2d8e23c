"""Every kernel instantiation compiles with NVRTC for sm_80 and sm_90 on a
machine with no GPU (NVRTC needs none), with the options CuPy is given."""
import os

import numpy as np
import pytest

import cuprope
from cuprope._core import args as _args
from cuprope._core import loader as _loader
from cuprope.rope import kernels as rope_kernels
from cuprope.kvcache import kernels as kv_kernels
from cuprope.mla import kernels as mla_kernels
from cuprope.prologue import kernels as prologue_kernels
from cuprope.qknorm import kernels as qknorm_kernels

nvrtc = pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings (test extra) not installed")
pathfinder = pytest.importorskip("cuda.pathfinder", reason="cuda-pathfinder (test extra) not installed")


def _check(result):
    err = result[0]
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, err
    return result[1:] if len(result) > 2 else (result[1] if len(result) == 2 else None)


def _build(arch: str, names, options, entry=rope_kernels.ENTRY):
    """(NVRTC result, log, program) of the kernel family compiled with ``options``."""
    src = _loader.kernel_sources()[entry].encode()
    prog = _check(nvrtc.nvrtcCreateProgram(src, entry.encode(), 0, [], []))
    for n in names:
        _check(nvrtc.nvrtcAddNameExpression(prog, n.encode()))
    cudart = pathfinder.find_nvidia_header_directory("cudart")
    if cudart is None:
        pytest.skip("CUDA runtime headers (nvidia-cuda-runtime wheel) not found")
    opts = [o.encode() for o in options] + [
        f"-I{cudart}".encode(), b"--std=c++17", b"-ftz=true", f"--gpu-architecture={arch}".encode()]
    rc = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)[0]
    size = _check(nvrtc.nvrtcGetProgramLogSize(prog))
    log = b" " * size
    _check(nvrtc.nvrtcGetProgramLog(prog, log))
    return rc, log.decode(errors="replace"), prog


def _compile(arch: str, names, entry=rope_kernels.ENTRY):
    """Compile the kernel family with the package's options and the flat
    entries' generated parameter lists."""
    rc, log, prog = _build(arch, names, _loader.compile_options() + _args.flat_defines(), entry)
    assert rc == nvrtc.nvrtcResult.NVRTC_SUCCESS, log
    lowered = {n: _check(nvrtc.nvrtcGetLoweredName(prog, n.encode())) for n in names}
    if arch.startswith("sm_"):
        nbytes = _check(nvrtc.nvrtcGetCUBINSize(prog))
    else:
        nbytes = _check(nvrtc.nvrtcGetPTXSize(prog))
    nvrtc.nvrtcDestroyProgram(prog)
    return lowered, nbytes, log


@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "compute_80"])
def test_every_instantiation_compiles(arch):
    names = _loader.all_kernel_names(entry=rope_kernels.ENTRY)
    # RoPE: 3 dtypes x 2 pairings x vector widths (4 for 16-bit, 3 for fp32) x 3 angle
    # sources (shared, per-head, cos/sin table) = 66;
    # LRPE: 5 activation families x 3 dtypes x 2 widths x per-head x fwd/bwd = 120,
    # plus 6 sequence-softmax statistics passes (3 dtypes x fwd/bwd);
    # QK-norm: 3 dtypes x 2 pairings x fwd/bwd = 12, as many of the fast path (head rows)
    # and of its model modes, plus the weight-gradient reduction
    assert len(names) == 66 + 120 + 6 + 12 + 12 + 12 + 1
    lowered, nbytes, log = _compile(arch, names)
    assert all(v for v in lowered.values()), lowered
    assert len(set(lowered.values())) == len(names)
    assert nbytes > 10_000
    assert "warning" not in log.lower(), log


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_kvcache_instantiation_compiles(arch):
    """The KV-cache dialect (kernels/kvcache.cu): computed angles x 4 fp8
    combinations (3 dtypes x 2 pairings x 2 widths = 48), the cos_sin_cache
    source in float32 or the element type (20), the WIDE computed-angle ones
    at the widest packs (3 x 2 x 4 = 24), the decode rows at the widest packs
    (3 x 2 reading the angle table, as many a float32 cos_sin_cache, 2 x 2 one
    in the 16-bit element type, 3 x 2 the caller's cos/sin tables: 22) and
    the angle table's builder (RopeConfig.cache_angles)."""
    names = _loader.all_kernel_names(entry=kv_kernels.ENTRY)
    assert len(names) == 48 + 20 + 24 + 22 + 1
    assert sorted(kv_kernels.kv_kernel_names() + rope_kernels.decode_kernel_names()) == \
        sorted(names)
    lowered, nbytes, log = _compile(arch, names, kv_kernels.ENTRY)
    assert all(lowered.values()) and len(set(lowered.values())) == len(names)
    assert nbytes > 10_000
    assert "warning" not in log.lower(), log


def test_a_missing_kv_code_stops_the_compile():
    opts = [o for o in _loader.compile_options() if not o.startswith("-DCUPROPE_KV_FP8_Q=")]
    rc, log, prog = _build("sm_90", [kv_kernels.kv_kernel_name("float32", False, 4)], opts,
                           kv_kernels.ENTRY)
    nvrtc.nvrtcDestroyProgram(prog)
    assert rc != nvrtc.nvrtcResult.NVRTC_SUCCESS
    assert "CUPROPE_KV_* codes are defined by cuprope/_core/loader.py" in log


def test_cache_key_covers_every_kernel_file(monkeypatch):
    """CuPy's disk cache keys on the source and the options but ignores
    #included files: the options carry a hash of every file in kernels/, so
    editing a header changes the key, and every kernel constant, so changing
    one does."""
    sources = _loader.kernel_sources()
    assert {"rope.cu", "rope.cuh", "constants.cuh", "args.cuh", "kvcache.cu",
            "kvcache.cuh"} <= set(sources)
    before = _loader.compile_options()
    assert any(o.startswith("-DCUPROPE_SOURCE_HASH=") for o in before)
    for name in sources:
        edited = dict(sources)
        edited[name] = edited[name] + "\n// edit\n"
        monkeypatch.setattr(_loader, "kernel_sources", lambda e=edited: e)
        assert _loader.compile_options() != before, name
    monkeypatch.setattr(_loader, "kernel_sources", lambda: sources)
    monkeypatch.setitem(_loader.TUNING, "CUPROPE_ROWS16", "2")
    assert _loader.compile_options() != before


def test_no_fast_math_option():
    assert not any("fast" in o for o in _loader.compile_options())


def _defines():
    """The -D options of compile_options() as {name: value}."""
    return dict(o[2:].partition("=")[::2] for o in _loader.compile_options() if o.startswith("-D"))


def test_host_and_kernels_read_one_set_of_constants():
    """loader.py owns every constant the kernels share with the host: the
    kernels get them as -D options (no header defines a default), and the
    host's values are the very same ones."""
    from cuprope.rope import launch
    d = _defines()
    for size, bits in ((2, 16), (4, 32)):
        assert d[f"CUPROPE_STAGES{bits}"] == str(launch.STAGES[size])
        assert d[f"CUPROPE_RUN{bits}"] == str(launch.RUNS[size])
        assert d[f"CUPROPE_RUN_STAGES{bits}"] == str(launch.RUN_STAGES[size])
        assert d[f"CUPROPE_WARPS{bits}"] == str(launch.WARPS_PER_BLOCK[size])
    assert d["CUPROPE_MAX_STEPS"] == str(launch.MAX_STEPS[rope_kernels.SRC_SHARED])
    assert d["CUPROPE_MAX_STEPS_TABLE"] == str(launch.MAX_STEPS[rope_kernels.SRC_TABLE])
    assert d["CUPROPE_TOKEN_RUNS"] == str(launch.TOKEN_RUNS)
    assert d["CUPROPE_TOKEN_TILE"] == str(launch.TOKEN_TILE)
    assert d["CUPROPE_ACT_SOFTMAX"] == str(launch.SOFTMAX_HEAD)
    assert d["CUPROPE_ACT_SOFTMAX_SEQ"] == str(launch.SOFTMAX_SEQ)
    assert d["CUPROPE_SEQ_SLICES"] == str(launch.SEQ_SLICES)
    assert d["CUPROPE_SRC_TABLE"] == str(rope_kernels.SRC_TABLE)
    from cuprope.qknorm import launch as qknorm_launch
    assert d["CUPROPE_QKNORM_WARPS"] == str(qknorm_launch.WARPS)
    assert qknorm_launch.THREADS == 32 * qknorm_launch.WARPS
    assert d["CUPROPE_QKNORM_DW_PAD"] == str(qknorm_launch.DW_PAD)
    assert set(_loader.TUNING_DEFAULTS) | set(_loader.CODES) <= set(d)
    for name, text in _loader.kernel_sources().items():
        assert "#define CUPROPE_" not in text, name


def test_tuning_override_reaches_kernels_and_host():
    """CUPROPE_KERNEL_DEFINES overrides a default for the kernels' options and
    the host's values alike (a fresh process: both are read at import)."""
    import subprocess
    import sys
    code = ("from cuprope._core import loader; from cuprope.rope import launch; "
            "from cuprope.qknorm import launch as ql; "
            "o = loader.compile_options(); "
            "print('-DCUPROPE_STAGES16=2' in o, '-DCUPROPE_RUN32=8' in o, '-DCUPROPE_X' in o, "
            "'-DCUPROPE_QKNORM_WARPS=4' in o, launch.STAGES[2], launch.RUNS[4], ql.WARPS, "
            "ql.THREADS, ql.DW_PAD, launch.STAGES[4] == int(loader.TUNING_DEFAULTS["
            "'CUPROPE_STAGES32']))")
    env = dict(os.environ, CUPROPE_KERNEL_DEFINES="CUPROPE_STAGES16=2 CUPROPE_RUN32=8 CUPROPE_X "
               "CUPROPE_QKNORM_WARPS=4 CUPROPE_QKNORM_DW_PAD=8")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["True", "True", "True", "True", "2", "8", "4", "128", "8", "True"]
    with pytest.raises(ValueError, match="CUPROPE_SRC_TABLE is a code"):
        _loader._overrides("CUPROPE_ROWS16=2 CUPROPE_SRC_TABLE=3")


def test_a_missing_constant_stops_the_compile():
    """The headers keep no defaults: without loader.py's -D options the
    compile stops at constants.cuh's #error."""
    opts = [o for o in _loader.compile_options() if not o.startswith("-DCUPROPE_STAGES16=")]
    rc, log, prog = _build("sm_90", [rope_kernels.kernel_name("float32", False, 4)], opts)
    nvrtc.nvrtcDestroyProgram(prog)
    assert rc != nvrtc.nvrtcResult.NVRTC_SUCCESS
    assert "defined by cuprope/_core/loader.py" in log


@pytest.mark.parametrize("bad, says", [
    ("CUPROPE_THREADS=200", "CUPROPE_THREADS: whole warps"),
    ("CUPROPE_WARPS32=16", "CUPROPE_WARPS16/32: 1 to CUPROPE_THREADS / 32"),
    ("CUPROPE_QKNORM_WARPS=0", "CUPROPE_QKNORM_WARPS: 1 to 32"),
    ("CUPROPE_QKNORM_MIN_BLOCKS=0", "MIN_BLOCKS*: at least one"),
    ("CUPROPE_QKNORM_DW_PAD=2", "CUPROPE_QKNORM_DW_PAD: whole float4s")])
def test_a_tuning_value_the_kernels_cannot_take_stops_the_compile(bad, says):
    """The headers check the tuning values that reach the kernels (each
    here through a -D option, as CUPROPE_KERNEL_DEFINES would set it)."""
    name = bad.partition("=")[0]
    opts = [o for o in _loader.compile_options() if not o.startswith(f"-D{name}=")] + [f"-D{bad}"]
    rc, log, prog = _build("sm_90", [qknorm_kernels.QKNORM_DW_KERNEL], opts)
    nvrtc.nvrtcDestroyProgram(prog)
    assert rc != nvrtc.nvrtcResult.NVRTC_SUCCESS
    assert says in log, log


def test_ring_rules_agree_with_the_host():
    """The host sizes each block's shared memory by the same rule the kernel
    uses to pick the instantiations that load through a ring."""
    from cuprope.rope import launch
    src = "".join(_loader.kernel_sources().values())
    for size in (2, 4):
        assert launch.ring_stages(size, 16 // size, rope_kernels.SRC_SHARED) == launch.STAGES[size]
    # narrower packs, other angle sources and the LRPE dialect load into registers
    assert launch.ring_stages(2, 4, rope_kernels.SRC_SHARED) == 0
    assert launch.ring_stages(2, 8, rope_kernels.SRC_PER_HEAD) == 0
    assert launch.ring_stages(2, 8, rope_kernels.SRC_TABLE) == launch.STAGES[2]
    assert launch.ring_bytes(3, rope_kernels.SRC_TABLE) == (2 * 3 + 4) * 32 * 16
    assert launch.ring_bytes(3, rope_kernels.SRC_SHARED) == 2 * 3 * 32 * 16
    assert launch.ring_stages(2, 8, rope_kernels.SRC_SHARED, act=3) == 0
    assert launch.ring_stages(2, 8, rope_kernels.SRC_SHARED, backward_act=True) == 0
    assert "SRC != kSrcPerHead && ACT == kActNone && sizeof(T) * VEC == 16" in src
    assert "2 * kStages + (TABLE ? 4 : 0)" in src
    # token runs: the ring holds x (two packs a lane per stage; four with x
    # beside dO) and needs 16-byte packs
    assert ("sizeof(T) * VEC != 16 ? 0 : sizeof(T) == 4 ? CUPROPE_RUN_STAGES32 : "
            "CUPROPE_RUN_STAGES16") in src
    assert "kPacks = BWD ? 4 : 2" in src
    assert launch.token_ring_bytes(2, 8, False) == 2 * launch.RUN_STAGES[2] * 32 * 16
    assert launch.token_ring_bytes(4, 4, True) == 4 * launch.RUN_STAGES[4] * 32 * 16
    assert launch.token_ring_bytes(2, 1, False) == 0


def test_token_tiles(monkeypatch):
    """Token runs need a full run per lane (else 0: heads per warp); a tile is
    1, 2 or 4 runs, fewer when the grid would otherwise be thin."""
    from cuprope.rope import launch
    if not launch.TOKEN_RUNS:
        pytest.skip("token runs off (tuning run)")
    run16 = 4 * launch.RUNS[2]  # bf16 D 128: 8 chunks, 4 rows per warp step
    assert launch.token_tile(132, 2, 8, 32, 1, run16 - 1) == 0           # too short: decode-like
    assert launch.token_tile(132, 2, 8, 32, 1, run16) == run16            # one run, thin grid
    assert launch.token_tile(132, 2, 8, 32, 64, 8192) == 4 * run16         # plenty of warps
    want = 16 * 132 * launch.WARPS_PER_BLOCK[2]
    for b in (1, 4, 16):                                                 # Llama-3-8B prefill
        t = launch.token_tile(132, 2, 8, 32, b, 4096)
        assert t in (run16, 2 * run16, 4 * run16)
        assert t == run16 or b * 32 * (4096 // t) >= want                # longer only if still full
        assert t == 4 * run16 or b * 32 * (4096 // (2 * t)) < want       # and as long as that allows
    run32 = launch.RUNS[4]  # fp32 D 512: 64 chunks, one row per warp step
    assert launch.token_tile(132, 4, 64, 8, 2, 4096) in (run32, 2 * run32, 4 * run32)
    assert launch.token_tile(132, 4, 64, 8, 2, run32 - 1) == 0


def test_steps_cap_grows_with_the_prologue():
    """The shared source's per-warp cos/sin work grows with R and with a stream
    map, and the most steps a warp takes with it; other sources keep theirs."""
    from cuprope.rope import launch
    base = launch.MAX_STEPS[rope_kernels.SRC_SHARED]
    if not base:
        pytest.skip("no cap (tuning run)")
    assert launch.steps_cap(rope_kernels.SRC_SHARED, 64, 0) == base
    assert launch.steps_cap(rope_kernels.SRC_SHARED, 32, 0) == base
    assert launch.steps_cap(rope_kernels.SRC_SHARED, 128, 0) == 2 * base
    assert launch.steps_cap(rope_kernels.SRC_SHARED, 64, 0xdead) == 2 * base
    assert launch.steps_cap(rope_kernels.SRC_TABLE, 128, 0) == launch.MAX_STEPS[rope_kernels.SRC_TABLE]


def test_flat_entries_compile():
    """The flat entry points (kernels/flat.cuh) that cuprope.jax launches: one
    per angle source, dtype and pairing at the widest vector, and the LRPE
    dialect's fused backward."""
    names = [rope_kernels.flat_kernel_name(dt, il, _loader.vec_widths(dt)[0], src)
             for dt in _loader.DTYPE_CTYPES for il in (False, True)
             for src in (rope_kernels.SRC_SHARED, rope_kernels.SRC_PER_HEAD, rope_kernels.SRC_TABLE)]
    names.append(rope_kernels.flat_kernel_name("bfloat16", False, 8, rope_kernels.SRC_PER_HEAD,
                                          rope_kernels.LRPE_ACTS["silu"], True))
    lowered, nbytes, log = _compile("sm_90", names)
    assert all(lowered.values()) and len(set(lowered.values())) == len(names)
    assert "warning" not in log.lower(), log


def test_lrpe_seq_stats_flat_entries_compile():
    """The flat entries of LRPE's sequence-softmax statistics pass (its
    one-dimensional-block form for jaxlib's kernel call): every dtype, forward
    and backward, compile without warnings or spills."""
    names = [rope_kernels.seq_stats_kernel_name(dt, bwd).replace(
        "lrpe_seq_stats_kernel<", "lrpe_seq_stats_flat_kernel<")
        for dt in _loader.DTYPE_CTYPES for bwd in (False, True)]
    lowered, _, log = _compile("sm_90", names)
    assert all(lowered.values()) and len(set(lowered.values())) == len(names)
    assert "warning" not in log.lower(), log
    assert all(st == ld == 0 for _, st, ld in _resources("sm_90", names).values())


def _resources(arch, names, entry=rope_kernels.ENTRY):
    """{name expression: (registers, spill store bytes, spill load bytes)} from
    ptxas's verbose report in NVRTC's log."""
    import re
    rc, log, prog = _build(arch, names, list(_loader.compile_options()) + list(
        _args.flat_defines()) + ["--ptxas-options=-v"], entry)
    assert rc == nvrtc.nvrtcResult.NVRTC_SUCCESS, log
    lowered = {_check(nvrtc.nvrtcGetLoweredName(prog, n.encode())).decode(): n for n in names}
    nvrtc.nvrtcDestroyProgram(prog)
    out, fn, spill = {}, None, None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            fn = lowered.get(m.group(1))
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            spill = (int(m.group(1)), int(m.group(2)))
        m = re.search(r"Used (\d+) registers", line)
        if m and fn:
            out[fn] = (int(m.group(1)),) + spill
            fn = None
    assert set(out) == set(names), sorted(set(names) - set(out))
    return out


def test_qknorm_flat_entries_compile_without_new_spills():
    """The QK-norm flat entries (kernels/qknorm_flat.cuh) that cuprope.jax
    launches, every dtype, pairing and direction, the general body (VEC 0)
    and the fast path at the widest packs, compile for sm_90, and spill no
    more than the by-value kernel they wrap (the struct lives in shared
    memory, not in registers); the weight-gradient reduction has no spills."""
    pairs = {}
    for dt in _loader.DTYPE_CTYPES:
        for il in (False, True):
            for bwd in (False, True):
                pairs[qknorm_kernels.qknorm_flat_kernel_name(dt, il, 0, bwd)] = \
                    qknorm_kernels.qknorm_kernel_name(dt, il, bwd)
                for model in (False, True):
                    pairs[qknorm_kernels.qknorm_flat_kernel_name(dt, il, _loader.vec_widths(dt)[0],
                                                          bwd, model)] = \
                        qknorm_kernels.qknorm_rows_kernel_name(dt, il, bwd, model)
    assert len(pairs) == 36
    res = _resources("sm_90", list(pairs) + list(pairs.values()) + [qknorm_kernels.QKNORM_DW_KERNEL])
    # Expected: the 16-bit fast path at its register bounds (80 forward, 3 blocks
    # of 256 threads per SM; 128 backward, 2) spills where the by-value kernel,
    # which reads the fields as constant operands, spills less (the flat entry
    # loads them from shared memory into registers; since the prefetch of the
    # next unit, NOTES 33, the lanes also hold two units' packs). Measured with
    # NVRTC 13.5 here and the device's NVRTC: forward 20/28 bytes, interleaved
    # forward 64/120 and 76/116, backward 68/180; session 9's device NVRTC gave
    # the fp16 forward 48/84 from PTX identical to session 8's (ptx_diff); the
    # model modes (MODEL) with NVRTC 13.5: forward 44-52/72-84, interleaved
    # 88-96/104-124, interleaved backward 20/16 (the device's NVRTC: fp32
    # interleaved forward 24/32 too); since the forward's load ring (NOTES
    # 59), NVRTC 13.5: forward 8-12/4-8, model forward 36-80/32-52,
    # interleaved forward 108-136/52-104, backward 8-16/8-16; the device's NVRTC
    # (CUDA 13 on the H200): the fp16 model forward 128/124 against its by-value
    # kernel's 56/20; on the H100 (CUDA 13), the bf16 interleaved model forward
    # 196/228 against its by-value kernel's 108/68.
    expected = {}
    for dt in ("float16", "bfloat16"):
        for model in (False, True):
            expected[qknorm_kernels.qknorm_flat_kernel_name(dt, False, 8, False, model)] = (96, 128)
            expected[qknorm_kernels.qknorm_flat_kernel_name(dt, True, 8, False, model)] = \
                (224, 256) if model else (160, 192)
        expected[qknorm_kernels.qknorm_flat_kernel_name(dt, True, 8, True)] = (128, 256)
        expected[qknorm_kernels.qknorm_flat_kernel_name(dt, True, 8, True, True)] = (64, 64)
    for il in (False, True):  # the device's NVRTC: 24/32 interleaved, none here
        expected[qknorm_kernels.qknorm_flat_kernel_name("float32", il, 4, False, True)] = (64, 64)
    # Every entry is checked and every violation listed at once. Beyond the
    # measured values, an entry may spill what its by-value kernel spills plus
    # SLACK bytes each way (another compiler's choices; the struct's fields
    # spilled would be several times that).
    slack = 128
    bad = []
    for flat, by_value in pairs.items():
        regs, st, ld = res[flat]
        if ", 0, " in flat:  # the general body, uncapped: no spill at all
            if (st, ld) != (0, 0):
                bad.append((flat, res[flat]))
            continue
        allowed = [max(e, b + slack) for e, b in zip(expected.get(flat, (0, 0)),
                                                      res[by_value][1:])]
        if st > allowed[0] or ld > allowed[1]:
            bad.append((flat, res[flat], res[by_value]))
        # the fast path's bound: 2 (backward) or 3 blocks per SM
        bwd = flat.split(", ")[3].startswith("true")
        blocks = _loader.tuning("CUPROPE_QKNORM_MIN_BLOCKS_BWD" if bwd
                                else "CUPROPE_QKNORM_MIN_BLOCKS")
        threads = 32 * _loader.tuning("CUPROPE_QKNORM_WARPS")
        if regs > 65536 // (threads * blocks):
            bad.append((flat, "registers", regs))
    assert not bad, bad
    assert res[qknorm_kernels.QKNORM_DW_KERNEL][1:] == (0, 0)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_mla_instantiation_compiles(arch):
    """DeepSeek MLA (kernels/mla.cu): 3 dtypes x 2 pairings x 2 widths x 4
    fp8 combinations = 48 instantiations (ptxas also reports the KV
    dialect's angle-table builder, which kvcache.cuh defines). Held to 64
    registers (CUPROPE_MLA_MIN_BLOCKS 4), at most the 16 16-bit width-8 ones
    spill, and little (NOTES 44: more resident warps beat the spill)."""
    names = mla_kernels.mla_kernel_names()
    assert len(names) == 48 and len(set(names)) == 48
    rc, log, prog = _build(arch, names, _loader.compile_options() + ("-Xptxas=-v",),
                           mla_kernels.ENTRY)
    nvrtc.nvrtcDestroyProgram(prog)
    assert rc == nvrtc.nvrtcResult.NVRTC_SUCCESS, log
    assert "warning" not in log.lower(), log
    import re
    spills = [tuple(map(int, m)) for m in re.findall(
        r"(\d+) bytes spill stores, (\d+) bytes spill loads", log.replace("\0", ""))]
    assert len(spills) >= 48  # ptxas reported every function
    spilled = [sp for sp in spills if sp != (0, 0)]
    assert len(spilled) <= 16 and all(st <= 32 and ld <= 96 for st, ld in spilled), spills


def _ptx_bodies(arch, names, entry, options=None):
    """{name expression: its .entry's PTX text} of ``names`` compiled for
    ``arch`` (with ``options``, default the package's)."""
    import re
    rc, log, prog = _build(arch, names, _loader.compile_options() if options is None else options,
                           entry)
    assert rc == nvrtc.nvrtcResult.NVRTC_SUCCESS, log
    lowered = {n: _check(nvrtc.nvrtcGetLoweredName(prog, n.encode())).decode() for n in names}
    size = _check(nvrtc.nvrtcGetPTXSize(prog))
    ptx = b" " * size
    _check(nvrtc.nvrtcGetPTX(prog, ptx))
    nvrtc.nvrtcDestroyProgram(prog)
    bodies = {m.group(1): m.group(0) for m in re.finditer(
        r"\.entry (\w+)\(.*?\n\}\n", ptx.decode(errors="replace"), re.S)}
    return {n: bodies[lowered[n]] for n in names}


def _decode_op_kernels():
    """(entry, name expressions) of one instantiation of every kernel a decode
    op launches (enable_pdl), and the plain QK-norm kernels, which wait for
    nothing."""
    bf16 = "bfloat16"
    return [
        (kv_kernels.ENTRY, [rope_kernels.decode_kernel_name(bf16, False),
                            rope_kernels.decode_kernel_name(bf16, True, rope_kernels.KV_COS_SIN_F32),
                            kv_kernels.kv_kernel_name(bf16, False, 8, rope_kernels.KV_ANGLES, 3),
                            kv_kernels.kv_kernel_name(bf16, True, 8, rope_kernels.KV_COS_SIN_F32)]),
        (rope_kernels.ENTRY, [rope_kernels.kernel_name(bf16, False, 8),
                         rope_kernels.kernel_name("float32", True, 4, rope_kernels.SRC_PER_HEAD)]),
        (prologue_kernels.ENTRY, [prologue_kernels.prologue_kernel_name(bf16, False, 8, 3),
                                  prologue_kernels.prologue_kernel_name(bf16, False, 0)]),
        (mla_kernels.ENTRY, [mla_kernels.mla_kernel_name(bf16, True, 8, 3)]),
    ]


@pytest.mark.parametrize("arch", ["compute_90", "compute_80"])
def test_decode_op_kernels_wait_for_the_previous_grid_from_sm_90(arch):
    """Programmatic dependent launch: from sm_90 on, every kernel a decode op
    launches waits for the previous grid (griddepcontrol.wait) before its
    first global store, then lets the next one launch; older targets compile
    neither instruction. The QK-norm kernels (no enable_pdl) carry none."""
    import re
    for entry, names in _decode_op_kernels():
        for name, body in _ptx_bodies(arch, names, entry).items():
            waits = [m.start() for m in re.finditer(r"griddepcontrol\.wait", body)]
            launches = [m.start() for m in re.finditer(r"griddepcontrol\.launch_dependents", body)]
            if arch == "compute_80":
                assert not waits and not launches, name
                continue
            assert waits and launches, name
            assert min(waits) < min(launches), name
            first_store = body.find("st.global")
            assert first_store < 0 or min(waits) < first_store, name
    qk = [qknorm_kernels.qknorm_rows_kernel_name("bfloat16", False, False),
          qknorm_kernels.qknorm_kernel_name("bfloat16", False, False)]
    assert not any("griddepcontrol" in b for b in _ptx_bodies(arch, qk, rope_kernels.ENTRY).values())


def test_decode_rows_load_the_position_before_the_wait():
    """The decode rows (and the KV dialect's kernel) load what no earlier
    kernel writes (the position; slots) before griddepcontrol.wait, so those
    loads overlap the previous kernel; q and k come after it."""
    names = [rope_kernels.decode_kernel_name("bfloat16", False),
             kv_kernels.kv_kernel_name("bfloat16", False, 8, rope_kernels.KV_ANGLES, 3)]
    for name, body in _ptx_bodies("compute_90", names, kv_kernels.ENTRY).items():
        wait = body.find("griddepcontrol.wait")
        assert wait > 0 and "ld.global" in body[:wait], name


def _aligned_zeros(shape, dtype):
    """Zeros at a 256-byte aligned address (as GPU buffers are)."""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    buf = np.empty(n + 256, np.uint8)
    off = (-buf.ctypes.data) % 256
    return buf[off:off + n].view(dtype).reshape(shape)


def test_qknorm_rows_ring_and_item_count_agree_with_the_host(monkeypatch):
    """qknorm_rows_kernel's load ring: the host sizes it by the kernel's rule
    (forward two 16-byte packs a lane per stage, backward four, 0 stages:
    none); its work items are counted in 32 bits, so a call of more heads
    than ROWS_MAX_ITEMS in all runs the general kernel."""
    from cuprope import qknorm
    from cuprope._core.arrays import describe
    from cuprope.qknorm import launch as ql
    src = "".join(_loader.kernel_sources().values())
    assert "return BWD ? kQkStagesBwd : kQkStages;" in src
    assert "constexpr int kStage = (BWD ? 4 : 2) * 32;" in src
    assert "struct RowCursor {\n  int item;" in src
    fwd, bwd = ql.STAGES
    assert (fwd, bwd) == (_loader.tuning("CUPROPE_QKNORM_STAGES"),
                          _loader.tuning("CUPROPE_QKNORM_STAGES_BWD"))
    assert ql.ring_bytes(False) == ql.WARPS * fwd * 2 * 32 * 16
    assert ql.ring_bytes(True) == ql.WARPS * bwd * 4 * 32 * 16
    cfg = cuprope.RopeConfig(128)
    q, k = _aligned_zeros((2, 5, 4, 128), np.float16), _aligned_zeros((2, 5, 2, 128), np.float16)
    c = qknorm.QkNormCall.of(q, k, None, None, cfg, None, None, 1e-6, "rms", 0.0,
                             "norm_then_rope", "head", "exact", None, None, 0, None)
    outs = [describe(_aligned_zeros(x.shape, x.dtype), "out") for x in (q, k)]
    geo = ql.geometry(c, c.infos, outs, False, 132)
    assert geo.vec == 8 and geo.smem >= ql.ring_bytes(False)
    monkeypatch.setattr(ql, "ROWS_MAX_ITEMS", 2 * 5 * 6)
    assert ql.geometry(c, c.infos, outs, False, 132).vec == 8
    monkeypatch.setattr(ql, "ROWS_MAX_ITEMS", 2 * 5 * 6 - 1)
    assert ql.geometry(c, c.infos, outs, False, 132).vec == 0


def test_qknorm_rows_ring_settings_compile_and_bad_ones_stop():
    """The rows kernel's ring at other settings (the backward's ring at 4
    warps a block, which fits 48 KB; 2 stages forward) compiles, flat entries
    included; a ring of one stage stops the compile with its message."""
    names = [qknorm_kernels.qknorm_rows_kernel_name("bfloat16", il, bwd, False)
             for il in (False, True) for bwd in (False, True)]
    names += [qknorm_kernels.qknorm_flat_kernel_name("bfloat16", False, 8, True)]
    base = [o for o in _loader.compile_options() + _args.flat_defines()
            if not o.startswith(("-DCUPROPE_QKNORM_WARPS=", "-DCUPROPE_QKNORM_STAGES",
                                 "-DCUPROPE_QKNORM_MIN_BLOCKS"))]
    good = ["-DCUPROPE_QKNORM_WARPS=4", "-DCUPROPE_QKNORM_MIN_BLOCKS=6",
            "-DCUPROPE_QKNORM_MIN_BLOCKS_BWD=4", "-DCUPROPE_QKNORM_STAGES=2",
            "-DCUPROPE_QKNORM_STAGES_BWD=3"]
    rc, log, prog = _build("sm_90", names, base + good, qknorm_kernels.ENTRY)
    nvrtc.nvrtcDestroyProgram(prog)
    assert rc == nvrtc.nvrtcResult.NVRTC_SUCCESS, log
    bad = [o.replace("STAGES_BWD=3", "STAGES_BWD=1") for o in good]
    rc, log, prog = _build("sm_90", names[:1], base + bad, qknorm_kernels.ENTRY)
    nvrtc.nvrtcDestroyProgram(prog)
    assert rc != nvrtc.nvrtcResult.NVRTC_SUCCESS
    assert "CUPROPE_QKNORM_STAGES(_BWD): a ring of 2 to 8 units per warp" in log


def _maxntid(bounds_by_entry, options):
    """{name expression: its PTX .maxntid} of one kernel of each translation unit."""
    import re
    out = {}
    for entry, names in bounds_by_entry.items():
        for name, body in _ptx_bodies("compute_90", names, entry, options).items():
            out[name] = int(re.search(r"\.maxntid (\d+), 1, 1", body).group(1))
    return out


@pytest.mark.parametrize("tuned", [False, True], ids=["defaults", "other-block-sizes"])
def test_every_kernel_bound_is_the_block_its_host_launches(tuned):
    """Each kernel's __launch_bounds__ (PTX .maxntid) is the block size its
    launcher uses, from the same tuning value: a block larger than the bound
    would fail to launch, and a launcher's literal would drift from the
    kernels' value. The rope, KV-cache, decode-row and MLA kernels take
    CUPROPE_THREADS (the rope and decode launchers at most that); every
    QK-norm kernel, its flat entries and the prologue (launched with the
    QK-norm geometry) take 32 x CUPROPE_QKNORM_WARPS. Checked at the
    defaults and at other values of both."""
    from cuprope.rope import decode, launch
    from cuprope.mla import launch as mla_launch
    from cuprope.qknorm import launch as qk_launch
    opts = list(_loader.compile_options() + _args.flat_defines())
    threads, qk = _loader.tuning("CUPROPE_THREADS"), qk_launch.THREADS
    if tuned:  # the host's values follow the same tuning values (read once, at import)
        threads, qk = 128, 64
        new = {"CUPROPE_THREADS": threads, "CUPROPE_QKNORM_WARPS": qk // 32,
               "CUPROPE_WARPS16": 4, "CUPROPE_WARPS32": 4}
        opts = [o for o in opts if o.partition("=")[0][2:] not in new]
        opts += [f"-D{k}={v}" for k, v in new.items()]
    bf16 = "bfloat16"
    want = {
        rope_kernels.kernel_name(bf16, False, 8): threads,
        rope_kernels.flat_kernel_name(bf16, False, 8): threads,
        qknorm_kernels.qknorm_kernel_name(bf16, False, False): qk,
        qknorm_kernels.qknorm_rows_kernel_name(bf16, False, True): qk,
        qknorm_kernels.qknorm_flat_kernel_name(bf16, False, 0, False): qk,
        qknorm_kernels.qknorm_flat_kernel_name(bf16, False, 8, True, True): qk,
        qknorm_kernels.QKNORM_DW_KERNEL: qk,
        kv_kernels.kv_kernel_name(bf16, False, 8): threads,
        rope_kernels.decode_kernel_name(bf16, False): threads,
        rope_kernels.KV_ANGLE_TABLE_KERNEL: threads,
        mla_kernels.mla_kernel_name(bf16, False, 8): threads,
        prologue_kernels.prologue_kernel_name(bf16, False, 8): qk}
    by_entry = {rope_kernels.ENTRY: list(want)[:7], kv_kernels.ENTRY: list(want)[7:10],
                mla_kernels.ENTRY: list(want)[10:11], prologue_kernels.ENTRY: list(want)[11:]}
    assert _maxntid(by_entry, opts) == want
    assert mla_launch.THREADS == _loader.tuning("CUPROPE_THREADS")
    assert max(launch.WARPS_PER_BLOCK.values()) * 32 <= _loader.tuning("CUPROPE_THREADS")
    assert 32 * decode.WARPS <= _loader.tuning("CUPROPE_THREADS")  # decode.geometry: cx * hy <= 32
