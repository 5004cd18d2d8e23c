"""Position helpers against plain Python loops."""
import numpy as np
import pytest

from cuprope.rope.positions import context_parallel_positions, packed_positions


def loop_packed(cu, offset):
    out = []
    for i in range(len(cu) - 1):
        for t in range(cu[i], cu[i + 1]):
            out.append(offset + t - cu[i])
    return out


def loop_cp(total, cp, r):
    chunks = np.arange(total).reshape(2 * cp, -1)
    return list(np.concatenate([chunks[r], chunks[2 * cp - 1 - r]]))


@pytest.mark.parametrize("lens", [[5, 1, 9, 3], [1], [7, 0, 4]])
@pytest.mark.parametrize("offset", [0, 17])
def test_packed_positions_match_loop_numpy(lens, offset):
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    got = packed_positions(cu, offset=offset)
    assert got.dtype == np.int32
    assert list(got) == loop_packed(list(cu), offset)
    assert list(packed_positions(cu, int(cu[-1]), offset=offset, dtype="int64")) == list(got)


@pytest.mark.parametrize("cp,rank", [(1, 0), (2, 0), (2, 1), (4, 3), (8, 5)])
def test_context_parallel_positions_match_chunk_assignment(cp, rank):
    local = 6
    got = context_parallel_positions(local, cp, rank, offset=3)
    assert list(got) == [p + 3 for p in loop_cp(local * cp, cp, rank)]
    # every global position appears exactly once across ranks
    allpos = np.concatenate([context_parallel_positions(local, cp, r) for r in range(cp)])
    assert sorted(allpos) == list(range(local * cp))


def test_helpers_follow_the_framework_of_their_input():
    torch = pytest.importorskip("torch", reason="needs torch: pip install torch")
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    got = packed_positions(cu, 8)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.int32
    assert got.tolist() == loop_packed([0, 3, 8], 0)
    cp = context_parallel_positions(4, 2, 1, like=cu, dtype="int64")
    assert isinstance(cp, torch.Tensor) and cp.dtype == torch.int64
    assert cp.tolist() == loop_cp(8, 2, 1)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="local_len"):
        context_parallel_positions(5, 2, 0)
    with pytest.raises(ValueError, match="cp_rank"):
        context_parallel_positions(4, 2, 2)
    with pytest.raises(ValueError, match="cu_seqlens"):
        packed_positions(np.zeros((2, 2), np.int32))

