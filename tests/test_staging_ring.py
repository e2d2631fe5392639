"""engine/cache/staging.py: the disk tier's write staging. Pieces never overlap and stay inside the buffer, space comes
back as pieces are given back (oldest first or not), and a piece that does not fit now is refused, not waited for."""

import random

import pytest

from engine.cache.staging import StagingRing


def test_pieces_follow_each_other_and_wrap_past_the_oldest():
    ring = StagingRing(100)
    assert [ring.take(40), ring.take(40)] == [0, 40]
    assert ring.take(40) is None                       # 20 left at the end, the start in use
    ring.give_back(0)
    assert ring.take(30) == 0                          # wraps: [0, 30) is free again
    assert ring.take(20) is None                       # 10 between the newest and the oldest
    assert ring.take(10) == 30 and ring.used == 80
    ring.give_back(40)
    ring.give_back(0)
    ring.give_back(30)
    assert ring.used == 0 and ring.take(100) == 0
    assert StagingRing(10).take(11) is None


def test_churn_never_overlaps_and_gives_all_of_it_back():
    rng, ring = random.Random(0), StagingRing(1000)
    taken = refused = 0
    for _ in range(20_000):
        if ring.live and rng.random() < 0.5:
            # mostly the oldest (the writer's order), at times another (a job that failed before it was queued)
            start = ring.live[0 if rng.random() < 0.9 else rng.randrange(len(ring.live))][0]
            ring.give_back(start)
        elif ring.take(rng.randint(1, 300)) is None:
            refused += 1
        else:
            taken += 1
        pieces = sorted(ring.live)
        assert all(0 <= s < e <= ring.capacity for s, e in pieces)
        assert all(a[1] <= b[0] for a, b in zip(pieces, pieces[1:]))
    assert taken > 5_000 and refused > 100
    while ring.live:
        ring.give_back(ring.live[0][0])
    assert ring.used == 0 and ring.take(1000) == 0


def test_unpinned_staging_is_a_buffer_per_piece():
    ring = StagingRing(64)
    a, b = ring.view(ring.take(32), (2, 16), pinned=False), ring.view(ring.take(32), (4, 8), pinned=False)
    assert a.shape == (2, 16) and b.shape == (4, 8) and ring.buffer is None


@pytest.mark.gpu
def test_pinned_staging_is_one_buffer_of_the_bound():
    ring = StagingRing(1 << 20)
    pieces = [ring.view(ring.take(1 << 18), (4, 1 << 16), pinned=True) for _ in range(3)]
    assert all(p.is_pinned() for p in pieces)
    assert [p.data_ptr() - ring.buffer.data_ptr() for p in pieces] == [0, 1 << 18, 2 << 18]
    assert ring.buffer.numel() == 1 << 20
