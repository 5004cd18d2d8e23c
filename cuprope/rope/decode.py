"""Launches of few tokens (decode steps): the decode rows
(``kernels/decode.cuh``, ``rope_decode_kernel``) and the angle table they
read (:func:`angle_table`). A rotation of at most ``MAX_TOKENS`` tokens with
shared frequencies, no stream map and the widest packs launches the decode
rows instead of ``rope_kernel`` (``launch.rope_spec``) or ``kv_rope_kernel``
(``rotary_embedding``, ``cuprope.kvcache.launch.kv_spec``), with the same
arithmetic, so the same bits; ``MAX_TOKENS`` 0 turns the path off (the
tests compare the two).
"""
from __future__ import annotations

import warnings

from .._core import driver
from .args import KV_ARGS, TABLE_ARGS, ROPE_ARGS
from .._core.launcher import LaunchSpec, plan
from .._core.loader import ITEMSIZE, tuning, vec_widths
from .kernels import DECODE_FAMILY, KV_ANGLE_TABLE_KERNEL, KV_COS_SIN_T, decode_kernel_name

FAMILY = DECODE_FAMILY
# Read per launch plan (tests and benchmarks set them): the most tokens a
# launch may have to take the decode rows, and the most tokens (warps, at
# 32 threads a token's head group) per block.
MAX_TOKENS = tuning("CUPROPE_DECODE_MAX_TOKENS")
WARPS = tuning("CUPROPE_DECODE_WARPS")
if not 1 <= WARPS <= tuning("CUPROPE_THREADS") // 32:
    raise ValueError("CUPROPE_DECODE_WARPS: 1 to CUPROPE_THREADS / 32 tokens a block (the "
                     "decode kernel's __launch_bounds__)")
TABLE_BYTES = tuning("CUPROPE_ANGLE_TABLE_BYTES")
MAX_GRID_Y = 65535


def fits(dtype, vec, tokens) -> bool:
    """Whether a launch of ``tokens`` tokens at pack width ``vec`` takes the
    decode rows (they are instantiated for the widest packs only)."""
    return 0 < tokens <= MAX_TOKENS and vec == vec_widths(dtype)[0]


def table_aligned(dtype, interleaved, vec, src, ptr, row_stride) -> bool:
    """Whether a cos/sin table at byte address ``ptr`` with ``row_stride``
    elements per row allows the kernel's loads of a chunk's run of cos (or
    sin): G = vec (half split) or vec/2 (interleaved) values, in loads of
    at most 16 bytes."""
    item = ITEMSIZE[dtype] if src == KV_COS_SIN_T else 4
    group = vec // 2 if interleaved else vec
    piece = min(group * item, 16)
    return ptr % piece == 0 and (row_stride * item) % piece == 0


def geometry(sms, chunks, htot, n_batch, n_seq):
    """(grid, block) of the decode rows for ``n_batch`` x ``n_seq`` tokens:
    block (cx, hy, tz) = (chunk lanes, heads, tokens), cx·hy ~ one warp, tz
    tokens along B when S is 1 (along S otherwise), from 1 up to WARPS once
    the grid has ~4 blocks per SM; grid (S blocks, head groups, B) or, when
    S is 1, (1, head groups, B blocks): every index a block or thread index."""
    cx = min(chunks, 32)
    hy = max(1, min(32 // cx, htot))
    gy = -(-htot // hy)
    run = n_batch if n_seq == 1 else n_seq
    tz = max(1, min(WARPS, run, n_batch * n_seq * gy // (4 * sms)))
    if n_seq == 1:
        return (1, gy, -(-n_batch // tz)), (cx, hy, tz)
    return (-(-n_seq // tz), gy, n_batch), (cx, hy, tz)


# The decode rows: a thread per (token, head, chunk) whose cos/sin come from
# one row of an fp32 table, so its chain is two dependent loads (position,
# then the row). The core reads the config's angle table, rotary_embedding
# the caller's cos_sin_cache.
def spec(sms, *, dtype, interleaved, vec, src, rope_args, kv, calls, htot, chunks,
         n_batch, n_seq, pdl=False) -> LaunchSpec | None:
    """The decode rows' LaunchSpec (None where the grid cannot hold the
    heads or the sequences): ``rope_args`` a packed RopeArgs (its head
    groups and tiling are not read), ``kv`` KvArgs fields by name (the table:
    cs_ptr, cs_st, cs_rows), ``calls`` and ``pdl`` as LaunchSpec's."""
    grid, block = geometry(sms, chunks, htot, n_batch, n_seq)
    if grid[1] > MAX_GRID_Y or grid[2] > MAX_GRID_Y:
        return None
    return LaunchSpec(decode_kernel_name(dtype, interleaved, src), FAMILY, grid, block, 0,
                      [(ROPE_ARGS, rope_args), (KV_ARGS, KV_ARGS.pack(**kv))], calls, vec=vec,
                      align=vec * ITEMSIZE[dtype], pdl=pdl)


def table_rows(config) -> int:
    """Rows of ``config``'s angle table: ``cache_angles``' count where it was
    called (0: none), else as many as CUPROPE_ANGLE_TABLE_BYTES hold; 0 for
    per-head tables and stream maps, which one table row cannot hold."""
    if config.per_head or config.stream_map is not None:
        return 0
    if config.angle_rows is not None:
        return config.angle_rows
    return min(2 ** 31, TABLE_BYTES // (4 * config.rotary_dim))


def angle_table(config, device, stream_ptr=None):
    """``config``'s angle table on ``device``: CuPy float32 ``[rows, R]``,
    row p = scaled_cos_sin(p, θ_j) for the pairs j (cos, then sin), the
    kernels' own values; built on first use (``kv_angle_table_kernel``) and
    kept in ``config.angle_tables``. None when ``table_rows`` is 0, when the
    device had no room for it (a warning says so once; the kernels compute
    the angles instead), or while it is not built and ``stream_ptr`` is
    being captured into a CUDA graph (building it there would be captured
    too; nothing is kept then).

    Memory: ``rows · R · 4`` bytes per (config, device), built on the first
    launch that reads it: ``RopeConfig.cache_angles(n)`` sets ``rows`` (0:
    none), else ``CUPROPE_ANGLE_TABLE_BYTES`` (16 MiB) decides: 32768
    positions at R 128, 65536 at R 64. A token whose position lies past the
    table computes its cos/sin in float64 in the kernel, as the other paths
    do."""
    rows = table_rows(config)
    if not rows:
        return None
    if device in config.angle_tables:
        return config.angle_tables[device]
    if stream_ptr is not None and driver.capturing(stream_ptr):
        return None
    import cupy
    npairs = config.rotary_dim // 2
    inv_freq, _ = config.device_tables(device)
    with cupy.cuda.Device(device):
        try:
            table = cupy.empty((rows, 2 * npairs), dtype=cupy.float32)
        except cupy.cuda.memory.OutOfMemoryError:
            warnings.warn(f"cuprope: no room for the {rows * npairs * 8 / 2 ** 20:.1f} MiB angle "
                          f"table on GPU {device}; its launches compute every angle instead "
                          f"(RopeConfig.cache_angles sets the size)", RuntimeWarning, stacklevel=3)
            config.angle_tables[device] = None
            return None
        ra = ROPE_ARGS.pack(rot_dim=config.rotary_dim, inv_freq_ptr=inv_freq.data.ptr,
                            scale=config.scale, sin_sign=1.0)
        n = rows * npairs
        threads = tuning("CUPROPE_THREADS")  # kv_angle_table_kernel's bound (kThreads)
        build = LaunchSpec(KV_ANGLE_TABLE_KERNEL, FAMILY, (-(-n // threads), 1, 1),
                           (threads, 1, 1), 0,
                           [(ROPE_ARGS, ra),
                            (TABLE_ARGS, TABLE_ARGS.pack(out_ptr=table.data.ptr, rows=rows))])
        stream = cupy.cuda.get_current_stream()
        plan(build, device).run(stream.ptr)
        stream.synchronize()
    config.angle_tables[device] = table
    return table


class AngleSource:
    """The core's table for one launch plan, looked up (or built) only when
    the plan takes the decode rows: calling it gives (pointer, rows), (0, 0)
    without a table; ``settled`` is False when a table is wanted but could
    not be built now (a capture), so the plan should not be kept."""

    __slots__ = ("config", "device", "stream_ptr", "settled")

    def __init__(self, config, device, stream_ptr):
        self.config, self.device, self.stream_ptr = config, device, stream_ptr
        self.settled = True

    def __call__(self):
        table = angle_table(self.config, self.device, self.stream_ptr)
        if table is None:
            self.settled = not table_rows(self.config) or self.device in self.config.angle_tables
            return 0, 0
        return table.data.ptr, table.shape[0]
