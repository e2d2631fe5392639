"""CacheManager on its own (a tiny CacheTensors on the CPU, pages of 4 tokens): state slot layout, reservations,
prefix matching (pages and a snapshot), reference counts, LRU eviction of cached pages (and their snapshots) and the
rolling snapshot's promotion at release."""

from engine.cache.manager import CacheManager, PrefixHit, chain_hashes

PAGE = 4


def run(cache, n_tokens, first=0, marker=None):
    """A sequence of n_tokens (first, first + 1, ...) admitted with no prefix and computed in full, its pages indexed;
    marker: the value its GDN state ends with. Returns (pages, slot, hashes, tokens)."""
    tokens = list(range(first, first + n_tokens))
    pages, slot = cache.admit(PrefixHit(), n_tokens)
    cache.grow(pages, n_tokens)
    hashes = []
    cache.index_pages(hashes, tokens, n_tokens, pages)
    if marker is not None:
        cache.pools.conv[0, slot] = cache.pools.ssm[0, slot] = marker
    return pages, slot, hashes, tokens


def release(cache, pages, slot, hashes, tokens, total=None, rolling_slot=-1):
    cache.release(pages=pages, state_slot=slot, total_tokens=total or len(tokens), hashes=hashes, tokens=tokens,
                  num_computed=len(tokens), rolling_slot=rolling_slot)


def test_state_slots_are_live_ones_then_snapshots_then_scratch(tiny_pools):
    cache = CacheManager(tiny_pools(num_pages=8, num_slots=6), num_seq_slots=2)
    assert cache.scratch_slot == 5
    assert [cache.snapshots.take() for _ in range(4)] == [2, 3, 4, -1]
    assert sorted(cache.seq_slots.take(2)) == [0, 1] and cache.seq_slots.free == 0


def test_reservation_is_taken_as_pages_grow_and_returns_to_zero_at_release(tiny_pools):
    cache = CacheManager(tiny_pools(num_pages=10, num_slots=4), num_seq_slots=2)
    pages, slot = cache.admit(PrefixHit(), total_tokens=13)          # 4 pages promised
    assert pages == [] and cache.reserved == 4 and cache.available_pages() == 6
    cache.grow(pages, 5)
    assert len(pages) == 2 and cache.reserved == 2 and cache.available_pages() == 6
    assert cache.can_admit(PrefixHit(), 24) and not cache.can_admit(PrefixHit(), 25)   # 6 pages fit, 7 do not
    cache.release(pages=pages, state_slot=slot, total_tokens=13, hashes=[], tokens=[], num_computed=0)   # cancelled
    assert cache.reserved == 0 and cache.available_pages() == 10
    assert cache.stats()["kv_pages_used"] == 0 and cache.stats()["state_slots_used"] == 0
    assert cache.stats()["kv_pages_cached"] == 0                      # nothing computed: nothing indexed


def test_admission_needs_a_free_live_slot(tiny_pools):
    cache = CacheManager(tiny_pools(num_pages=10, num_slots=3), num_seq_slots=1)
    assert cache.can_admit(PrefixHit(), 4)
    cache.admit(PrefixHit(), 4)
    assert not cache.can_admit(PrefixHit(), 4) and cache.available_pages() == 9


def test_a_prefix_hit_needs_the_pages_and_a_snapshot_at_the_same_boundary(tiny_pools):
    cache = CacheManager(tiny_pools(num_pages=10, num_slots=4), num_seq_slots=2)
    pages, slot, hashes, tokens = run(cache, 12, marker=42.0)
    assert hashes == chain_hashes(tokens, PAGE) and all(cache.index[h] == p for h, p in zip(hashes, pages))
    assert cache.match_prefix(tokens + [99]) == PrefixHit()          # pages indexed, no snapshot: no hit
    cache.snapshots.save(slot, hashes[1])                              # the state after 8 tokens
    release(cache, pages, slot, hashes, tokens)
    hit = cache.match_prefix(tokens + [99])
    assert hit == PrefixHit(list(pages[:2]), 8, hashes[1])                   # page 3 is indexed but has no snapshot
    assert cache.match_prefix(tokens[:9]) == PrefixHit(list(pages[:2]), 8, hashes[1])
    assert cache.match_prefix(tokens[:8]) == PrefixHit()               # at least one token is left to compute
    assert cache.match_prefix([7] + tokens[1:]) == PrefixHit()         # a different first page: a different chain
    assert cache.match_prefix(tokens[:4] + [0] * 8) == PrefixHit()     # the first page alone has no snapshot


def test_admitting_a_hit_shares_the_pages_and_restores_the_snapshot(tiny_pools):
    pools = tiny_pools(num_pages=6, num_slots=4)
    cache = CacheManager(pools, num_seq_slots=2)
    pages, slot, hashes, tokens = run(cache, 12, marker=42.0)
    cache.snapshots.save(slot, hashes[1])
    release(cache, pages, slot, hashes, tokens)
    assert cache.stats()["kv_pages_cached"] == 3 and cache.available_pages() == 6
    hit = cache.match_prefix(tokens + [99])
    assert cache.can_admit(hit, 24)          # 6 pages: 2 from the hit, 4 more
    assert not cache.can_admit(hit, 28)      # 5 more would fit among 6 available, but 2 of those are the hit's own
    got, new_slot = cache.admit(hit, 24)
    assert got == pages[:2] and [cache.refs[p] for p in pages] == [1, 1, 0]
    assert cache.stats()["kv_pages_cached"] == 1 and cache.reserved == 4
    assert pools.conv[0, new_slot].item() == pools.ssm[0, new_slot].item() == 42.0
    assert cache.stats()["prefix_hit_tokens"] == 8


def test_a_shared_page_is_cached_only_when_its_last_user_releases_it(tiny_pools):
    cache = CacheManager(tiny_pools(num_pages=10, num_slots=4), num_seq_slots=2)
    a_pages, a_slot, a_hashes, a_tokens = run(cache, 8)
    cache.snapshots.save(a_slot, a_hashes[0])
    cache.index_pages(a_hashes, a_tokens, 8, a_pages)                 # running, indexed: others can share it
    b_tokens = a_tokens[:4] + [50, 51, 52]
    hit = cache.match_prefix(b_tokens)
    b_pages, b_slot = cache.admit(hit, 8)
    cache.grow(b_pages, 8)
    assert b_pages[0] == a_pages[0] and cache.refs[a_pages[0]] == 2
    release(cache, a_pages, a_slot, a_hashes, a_tokens)
    assert cache.refs[a_pages[0]] == 1 and cache.stats()["kv_pages_cached"] == 1     # A's own second page
    cache.release(pages=b_pages, state_slot=b_slot, total_tokens=8, hashes=[], tokens=b_tokens, num_computed=7)
    assert cache.stats()["kv_pages_cached"] == 2 and cache.stats()["kv_pages_used"] == 0
    assert cache.reserved == 0 and cache.available_pages() == 10


def test_cached_pages_are_evicted_least_recently_used_first_and_take_their_snapshots(tiny_pools):
    cache = CacheManager(tiny_pools(num_pages=6, num_slots=6), num_seq_slots=2)
    a_pages, a_slot, a_hashes, a_tokens = run(cache, 8, first=0)
    cache.snapshots.save(a_slot, a_hashes[0])
    cache.snapshots.save(a_slot, a_hashes[1])
    release(cache, a_pages, a_slot, a_hashes, a_tokens)
    b_pages, b_slot, b_hashes, b_tokens = run(cache, 8, first=100)
    cache.snapshots.save(b_slot, b_hashes[1])
    release(cache, b_pages, b_slot, b_hashes, b_tokens)
    assert a_pages == [0, 1] and b_pages == [2, 3] and len(cache.snapshots) == 3
    pages, _ = cache.admit(PrefixHit(), 16)
    cache.grow(pages, 12)                        # the 2 free pages, then A's last page: released first, evicted first
    assert pages == [4, 5, 1]
    assert a_hashes[1] not in cache.index and a_hashes[1] not in cache.snapshots
    assert a_hashes[0] in cache.snapshots and b_hashes[1] in cache.snapshots and len(cache.snapshots) == 2
    assert cache.match_prefix(a_tokens + [9]) == PrefixHit([0], 4, a_hashes[0])   # what is left of A's prefix
    cache.grow(pages, 16)                        # then A's first page: a prefix's last pages go before its first
    assert pages == [4, 5, 1, 0] and a_hashes[0] not in cache.snapshots
    assert cache.match_prefix(b_tokens + [9]) == PrefixHit([2, 3], 8, b_hashes[1])
    assert cache.stats()["kv_pages_cached"] == 2 and cache.reserved == 0


def test_the_rolling_snapshot_is_kept_at_release_under_the_last_full_page(tiny_pools):
    pools = tiny_pools(num_pages=10, num_slots=6)
    cache = CacheManager(pools, num_seq_slots=2)
    tokens = list(range(9))
    pages, slot = cache.admit(PrefixHit(), 12)
    cache.grow(pages, 9)
    pools.conv[0, slot] = pools.ssm[0, slot] = 8.0          # the state after 8 tokens: decode passed a page boundary
    rolling = cache.snapshots.roll(slot, -1)
    pools.conv[0, slot] = pools.ssm[0, slot] = 9.0
    hashes = []
    cache.release(pages=pages, state_slot=slot, total_tokens=12, hashes=hashes, tokens=tokens, num_computed=9,
                  rolling_slot=rolling)
    assert hashes == chain_hashes(tokens, PAGE) and hashes[-1] in cache.index and hashes[-1] in cache.snapshots
    hit = cache.match_prefix(tokens + [5])
    assert hit == PrefixHit(list(pages[:2]), 8, hashes[-1])
    _, new_slot = cache.admit(hit, 12)
    assert pools.conv[0, new_slot].item() == 8.0


def test_a_rolling_snapshot_with_no_full_page_to_key_it_is_given_back(tiny_pools):
    cache = CacheManager(tiny_pools(num_pages=10, num_slots=5), num_seq_slots=2)
    pages, slot = cache.admit(PrefixHit(), 4)
    cache.grow(pages, 3)
    rolling = cache.snapshots.roll(slot, -1)
    cache.release(pages=pages, state_slot=slot, total_tokens=4, hashes=[], tokens=[1, 2, 3], num_computed=3,
                  rolling_slot=rolling)
    assert len(cache.snapshots) == 0 and cache.index == {}
    assert sorted([cache.snapshots.take(), cache.snapshots.take()]) == [2, 3]      # both snapshot slots are free
    assert cache.snapshots.take() == -1
