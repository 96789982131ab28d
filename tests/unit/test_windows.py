import numpy as np
import pytest

from raydp_llm.data import windows


def reference_windows(n, boundary, block, stride):
    """Brute force: every start of each split whose window fits inside the split."""
    out = {}
    for name, lo, hi in (("train", 0, boundary), ("val", boundary, n)):
        out[name] = [s for s in range(lo, hi, stride) if s + block + 1 <= hi]
    return out


@pytest.mark.parametrize("n,block,stride,val_fraction", [
    (1000, 8, 8, 0.1), (1000, 8, 3, 0.1), (997, 16, 1, 0.25), (100, 9, 20, 0.5), (64, 64, 64, 0.1),
])
def test_window_starts_match_brute_force(n, block, stride, val_fraction):
    boundary = windows.split_boundary(n, val_fraction)
    expected = reference_windows(n, boundary, block, stride)
    assert windows.window_starts(0, boundary, 0, n, block, stride).tolist() == expected["train"]
    assert windows.window_starts(boundary, n, 0, n, block, stride).tolist() == expected["val"]
    assert windows.count_windows(0, boundary, block, stride) == len(expected["train"])


def test_no_window_crosses_the_split():
    n, block, stride = 5000, 32, 5
    boundary = windows.split_boundary(n, 0.1)
    for lo, hi in ((0, boundary), (boundary, n)):
        starts = windows.window_starts(lo, hi, 0, n, block, stride)
        assert (starts >= lo).all() and (starts + block + 1 <= hi).all()


def test_split_boundary_is_the_tail():
    assert windows.split_boundary(1000, 0.1) == 900
    assert windows.split_boundary(1001, 0.1) == 901


@pytest.mark.parametrize("block,stride", [(10, 7), (10, 10), (10, 1), (40, 3)])
def test_per_piece_cut_with_halos_equals_whole_stream_cut(block, stride):
    """Each piece cutting the windows that start in it, with its halo, gives exactly the
    whole-stream windows, also when pieces are shorter than a block (empty ones included)."""
    rng = np.random.default_rng(0)
    lengths = [37, 1, 0, 120, 64, 9, 3, 250]
    stream = rng.integers(0, 60, sum(lengths)).astype(np.uint16)
    n = len(stream)
    boundary = windows.split_boundary(n, 0.2)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    pieces = [stream[o:o + k] for o, k in zip(offsets, lengths)]
    halos = windows.halos([p[:block] for p in pieces], block)
    got = {"train": [], "val": []}
    for off, piece, halo in zip(offsets, pieces, halos):
        local = np.concatenate([piece, halo])
        for name, lo, hi in (("train", 0, boundary), ("val", boundary, n)):
            starts = windows.window_starts(lo, hi, int(off), int(off) + len(piece), block, stride)
            cut = windows.cut_windows(local, int(off), starts, block)
            got[name] += [(int(s), w.tolist()) for s, w in zip(starts, cut)]
    expected = reference_windows(n, boundary, block, stride)
    for name in ("train", "val"):
        assert sorted(got[name]) == [(s, stream[s:s + block + 1].tolist()) for s in expected[name]]
