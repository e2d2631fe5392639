"""Snapshots on their own: slots taken, kept under a key, looked up, restored, evicted least recently used first,
forgotten with their page, and the rolling snapshot promoted or given back."""

import pytest

from engine.cache.snapshots import Snapshots

A, B, C = b"page-a", b"page-b", b"page-c"


def state(pools, slot: int) -> float:
    """The value slot `slot` holds (both its conv window and its recurrent state, which always move together)."""
    conv, ssm = pools.conv[0, slot].item(), pools.ssm[0, slot].item()
    assert conv == ssm, (conv, ssm)
    return conv


@pytest.fixture
def pools(tiny_pools):
    return tiny_pools(num_pages=4, num_slots=8)


def test_take_gives_free_slots_lowest_first_then_evicts_the_least_recently_used(pools):
    snaps = Snapshots(pools, range(4, 7))
    assert [snaps.take() for _ in range(3)] == [4, 5, 6]
    snaps.keep(4, A)
    snaps.keep(5, B)
    snaps.keep(6, C)
    assert len(snaps) == 3 and A in snaps and B in snaps and C in snaps
    assert snaps.take() == 4 and A not in snaps      # A was kept first
    assert snaps.take() == 5 and B not in snaps
    snaps.drop(4)                                     # given back, not kept: free again
    assert snaps.take() == 4
    assert snaps.take() == 6 and len(snaps) == 0
    assert snaps.take() == -1                         # every slot is out and none is kept


def test_keeping_a_key_again_replaces_the_older_snapshot_and_frees_its_slot(pools):
    snaps = Snapshots(pools, range(4, 7))
    first, second = snaps.take(), snaps.take()
    snaps.keep(first, A)
    snaps.keep(second, A)
    assert len(snaps) == 1
    assert snaps.take() == first                      # the replaced one's slot is free, not evicted
    snaps.keep(second, A)                             # the same slot under the same key: nothing to give back
    assert len(snaps) == 1 and A in snaps
    assert snaps.take() == 6                          # the last free slot
    assert snaps.take() == second and A not in snaps  # then A's, evicted
    assert snaps.take() == -1


def test_save_copies_the_live_state_and_restore_copies_it_into_a_live_slot(pools):
    snaps = Snapshots(pools, range(4, 7))
    snaps.save(1, A)                                  # live slot 1 holds 1.0
    assert state(pools, 4) == 1.0 and A in snaps
    pools.conv[0, 1] = pools.ssm[0, 1] = 99.0         # the live sequence moves on
    snaps.restore(A, 2)
    assert state(pools, 2) == 1.0 and state(pools, 4) == 1.0


def test_restore_makes_a_snapshot_the_most_recently_used(pools):
    snaps = Snapshots(pools, range(4, 6))
    snaps.save(0, A)
    snaps.save(1, B)
    snaps.restore(A, 2)
    assert snaps.take() == 5 and B not in snaps and A in snaps     # B, not the restored A, is evicted


def test_save_with_no_slot_to_be_had_keeps_nothing(pools):
    snaps = Snapshots(pools, range(4, 5))
    rolling = snaps.take()                            # held by a decoding sequence: not evictable
    snaps.save(0, A)
    assert A not in snaps and len(snaps) == 0 and state(pools, rolling) == 4.0


def test_forget_frees_the_slot_of_a_page_that_left_the_index(pools):
    snaps = Snapshots(pools, range(4, 6))
    snaps.save(0, A)
    snaps.forget(A)
    snaps.forget(B)                                   # no snapshot there: nothing happens
    assert A not in snaps and len(snaps) == 0
    assert sorted([snaps.take(), snaps.take()]) == [4, 5] and snaps.take() == -1


def test_rolling_snapshot_takes_one_slot_and_follows_the_state(pools):
    snaps = Snapshots(pools, range(4, 6))
    rolling = snaps.roll(1, -1)
    assert rolling == 4 and state(pools, 4) == 1.0 and len(snaps) == 0     # held, not kept
    pools.conv[0, 1] = pools.ssm[0, 1] = 7.0          # the next page boundary
    assert snaps.roll(1, rolling) == rolling and state(pools, rolling) == 7.0
    assert snaps.take() == 5 and snaps.take() == -1   # the rolling slot is not evictable
    assert snaps.roll(2, -1) == -1                    # another sequence finds none: no rolling snapshot


def test_promote_keeps_the_rolling_snapshot_under_its_key_or_gives_it_back(pools):
    snaps = Snapshots(pools, range(4, 6))
    kept = snaps.roll(1, -1)
    snaps.promote(kept, A)
    assert A in snaps and len(snaps) == 1
    given_back = snaps.roll(2, -1)
    snaps.promote(given_back, None)                   # its page is not indexed: nobody could find it
    assert len(snaps) == 1 and snaps.take() == given_back
    snaps.promote(-1, B)                              # a sequence that never rolled: nothing to promote
    assert B not in snaps
    snaps.restore(A, 3)
    assert state(pools, 3) == 1.0
