"""Context parallelism across GPUs: one process per GPU (torch.distributed, NCCL),
each rotating its load-balanced share of a long sequence with positions from
cuprope.positions; the gathered result equals one rotation of the whole
sequence. Skipped below two GPUs."""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import cuprope  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.device_count() >= 2
                            and cuprope.gpu_available()),
                       reason="needs two CUDA GPUs"),
]


def _worker(rank, world, port, seq_local, result_dir):
    import torch.distributed as dist

    from cuprope.positions import context_parallel_positions
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never NVLink multicast on shared hosts
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    g = torch.Generator().manual_seed(0)
    total = seq_local * world
    full = torch.randn(1, total, 4, 64, generator=g).to(torch.bfloat16)
    chunks = full.chunk(2 * world, dim=1)
    local = torch.cat([chunks[rank], chunks[2 * world - 1 - rank]], dim=1).cuda(rank)
    pos = context_parallel_positions(seq_local, world, rank, like=local, dtype="int64")
    cfg = cuprope.RopeConfig(64)
    out = cuprope.rope_forward(local, cfg, positions=pos)
    assert out.device.index == rank
    gathered = [torch.empty_like(out) for _ in range(world)]
    dist.all_gather(gathered, out)
    if rank == 0:
        c = seq_local // 2
        pieces = [None] * (2 * world)
        for r, t in enumerate(gathered):
            pieces[r], pieces[2 * world - 1 - r] = t[:, :c], t[:, c:]
        whole = torch.cat(pieces, dim=1).float().cpu().numpy()
        ref = cuprope.rope_forward(full.float().numpy(), cfg)   # NumPy backend, whole sequence
        np.save(os.path.join(result_dir, "err.npy"), np.abs(whole - ref).max(keepdims=True))
    dist.barrier()
    dist.destroy_process_group()


def test_context_parallel_ranks_reassemble_the_full_rotation(tmp_path):
    import torch.multiprocessing as mp
    world = min(torch.cuda.device_count(), 4)
    port = 29500 + os.getpid() % 1000
    mp.spawn(_worker, args=(world, port, 256, str(tmp_path)), nprocs=world, join=True)
    err = float(np.load(tmp_path / "err.npy").max())
    assert err < 0.05, err   # bf16 outputs vs a float64 rotation of the same bf16 inputs
