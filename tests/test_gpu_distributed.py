"""Context parallelism across GPUs: one process per GPU (torch.distributed, NCCL),
each rotating its load-balanced share of a long sequence with positions from
cuprope.positions; the gathered result equals one rotation of the whole
sequence; and the fused QK-norm + RoPE and KV append run per rank on each
rank's own GPU and stream, equal to one GPU's results bit for bit. Skipped
below two GPUs."""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs torch: pip install torch")
import cuprope  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.device_count() >= 2
                            and cuprope.gpu_available()),
                       reason="needs two CUDA GPUs visible to torch and CuPy"),
]


def _worker(rank, world, port, seq_local, result_dir):
    import torch.distributed as dist

    from cuprope.rope.positions import context_parallel_positions
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


# ---------------------------------------------------------------- fused ops per rank

FUSED = ("qknorm", "kvcache")


def _fused_worker(rank, world, port, result_dir):
    """Each rank: the fused QK-norm + RoPE forward/backward and the fused KV
    append on its own GPU, on a side stream made current, on inputs of its own
    seed. Rank 0 gathers every rank's output bytes (NCCL) and compares them with
    the same calls made by this process on GPU 0 for each rank's seed."""
    import torch.distributed as dist
    from test_gpu_multi_device import run
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never NVLink multicast on shared hosts
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    side = torch.cuda.Stream(rank)
    with torch.cuda.stream(side):
        outs = {c: run(c, f"cuda:{rank}", seed=100 + rank) for c in FUSED}
    torch.cuda.current_stream().wait_stream(side)
    report = []
    for case in FUSED:
        for name in sorted(outs[case]):
            t = outs[case][name]
            assert t.device.index == rank, (name, t.device)
            mine = t.detach().contiguous().view(torch.uint8).flatten()
            gathered = [torch.empty_like(mine) for _ in range(world)]
            dist.all_gather(gathered, mine)
            if rank == 0:
                for r in range(world):
                    want = run(case, "cuda:0", seed=100 + r)[name]
                    want = want.detach().contiguous().view(torch.uint8).flatten()
                    if not torch.equal(gathered[r].cpu(), want.cpu()):
                        report.append(f"rank {r} {name}")
    if rank == 0:
        with open(os.path.join(result_dir, "fused.txt"), "w") as f:
            f.write("\n".join(report) if report else "ok")
    dist.barrier()
    dist.destroy_process_group()


def test_fused_qknorm_and_kv_append_per_rank_equal_one_gpu(tmp_path):
    import torch.multiprocessing as mp
    world = min(torch.cuda.device_count(), 4)
    port = 29500 + (os.getpid() + 500) % 1000
    mp.spawn(_fused_worker, args=(world, port, str(tmp_path)), nprocs=world, join=True)
    result = (tmp_path / "fused.txt").read_text()
    assert result == "ok", f"outputs differing from one GPU's: {result}"
