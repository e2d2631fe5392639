"""The host tier on its own (real CacheTensors on the CPU): pages and snapshots copied out and back bit for bit (int8
KV with its scales too), slabs grown only within the budget, LRU eviction that spares held entries; and CacheManager
spilling GPU evictions into it and restoring a hit from it."""

import pytest
import torch

from engine.cache.manager import CacheManager, PrefixHit
from engine.cache.host import HostCache
from engine.cache.pages import CacheTensors


def pools(num_pages=6, num_slots=5, page_size=4, int8=False, seed=0) -> CacheTensors:
    """Random pools: 2 attention layers, 2 heads of 8; 3 GDN layers whose state is bigger than a page."""
    g = torch.Generator().manual_seed(seed)
    shape = (2, num_pages, page_size, 2, 8)
    kv = (lambda: torch.randint(-127, 128, shape, generator=g, dtype=torch.int8)) if int8 else \
        (lambda: torch.randn(shape, generator=g))
    scale = (lambda: torch.rand(shape[:-1], generator=g)) if int8 else (lambda: None)
    return CacheTensors(k=kv(), v=kv(), k_scale=scale(), v_scale=scale(),
                        conv=torch.randn(3, num_slots, 3, 40, generator=g),
                        ssm=torch.randn(3, num_slots, 2, 4, 4, generator=g), page_size=page_size)


def page_of(p: CacheTensors, page: int) -> list[torch.Tensor]:
    return [t[:, page].clone() for t in (p.k, p.v, p.k_scale, p.v_scale) if t is not None]


@pytest.mark.parametrize("int8", [False, True])
def test_pages_and_snapshots_come_back_bit_for_bit(int8):
    p = pools(int8=int8)
    host = HostCache(p, budget_bytes=1 << 20)
    assert host.state_blocks > 1                       # a snapshot spans several blocks
    want = {page: page_of(p, page) for page in (1, 4, 2)}
    state = (p.conv[:, 3].clone(), p.ssm[:, 3].clone())
    host.put_pages([b"a", b"b", b"c"], [1, 4, 2])
    host.put_state(b"s", 3)
    for t in (p.k, p.v, p.conv, p.ssm):
        t.zero_()                                      # the GPU copies are overwritten
    host.load_pages([b"c", b"a", b"b"], [0, 5, 3])
    host.load_state(b"s", 0)
    for got, src in ((0, 2), (5, 1), (3, 4)):
        assert all(torch.equal(a, b) for a, b in zip(page_of(p, got), want[src]))
    assert torch.equal(p.conv[:, 0], state[0]) and torch.equal(p.ssm[:, 0], state[1])
    s = host.stats()
    assert (s["host_pages"], s["host_snapshots"], s["host_hit_pages"], s["host_hit_snapshots"]) == (3, 1, 3, 1)


def test_the_budget_bounds_the_slabs_and_the_least_recently_used_go_first():
    p = pools(num_pages=8)
    budget = 4 * p.page_nbytes                         # four blocks: no room for a snapshot beside four pages
    host = HostCache(p, budget_bytes=budget)
    assert host.stats()["host_bytes"] == 0             # nothing is allocated before it is needed
    host.put_pages([b"0", b"1", b"2", b"3"], [0, 1, 2, 3])
    host.load_pages([b"0"], [7])                       # "0" is now the most recently used
    host.put_pages([b"4"], [4])
    assert not host.has("page", b"1") and host.has("page", b"0") and host.has("page", b"4")
    assert host.stats()["host_bytes"] <= budget
    host.put_state(b"s", 1)                            # needs every block (state_blocks <= 4 here)
    assert host.has("state", b"s") and host.stats()["host_pages"] == 4 - host.state_blocks


def test_a_budget_of_part_slabs_is_used_to_the_last_block(monkeypatch):
    p = pools(num_pages=8)
    monkeypatch.setattr("engine.cache.host.SLAB_BYTES", 3 * p.page_nbytes)      # slabs of 3 blocks, budget 7
    host = HostCache(p, budget_bytes=7 * p.page_nbytes)
    keys = [bytes([i]) for i in range(7)]
    host.put_pages(keys[:6], list(range(6)))
    host.put_pages(keys[6:], [6])                                               # the short last slab
    host.discard("page", keys[6])
    host.put_pages(keys[6:], [6])                                               # its free block, nothing evicted
    assert all(host.has("page", k) for k in keys) and host.stats()["host_bytes"] == 7 * p.page_nbytes
    host.load_pages(keys, list(range(7)))
    host.put_pages([b"x"], [7])                                                 # now one is evicted
    assert host.has("page", b"x") and not host.has("page", keys[0]) and host.stats()["host_bytes"] == 7 * p.page_nbytes


def test_held_entries_are_not_evicted_and_a_full_host_drops_the_newcomer():
    p = pools(num_pages=8)
    host = HostCache(p, budget_bytes=2 * p.page_nbytes)
    host.put_pages([b"0", b"1"], [0, 1])
    host.held.update({("page", b"0"), ("page", b"1")})
    host.put_pages([b"2"], [2])
    assert host.has("page", b"0") and host.has("page", b"1") and not host.has("page", b"2")
    host.put_state(b"s", 3)                           # no room beside the held entries: refused, nothing evicted
    assert not host.has("state", b"s") and host.has("page", b"0") and host.has("page", b"1")
    host.held.clear()
    host.put_pages([b"2"], [2])
    assert host.has("page", b"2") and not host.has("page", b"0")


def test_a_batch_larger_than_the_budget_keeps_what_fits_consistently():
    p = pools(num_pages=8)
    host = HostCache(p, budget_bytes=3 * p.page_nbytes)
    want = {k: page_of(p, i) for i, k in enumerate([b"0", b"1", b"2", b"3", b"4"])}
    host.put_pages(list(want), list(range(5)))
    kept = [k for k in want if host.has("page", k)]
    assert len(kept) == 3
    host.load_pages(kept, [5, 6, 7])
    for page, k in zip([5, 6, 7], kept):
        assert all(torch.equal(a, b) for a, b in zip(page_of(p, page), want[k]))


def test_reserve_then_finish_keeps_the_filled_entries_within_the_budget():
    """The disk tier's path in: blocks for every new entry in order (a batch never evicts its own entries, and an entry
    being filled is never evicted), then finish keeps those filled; a key already kept is not reserved again; past the
    budget (once the entries outside the batch are evicted) the rest are refused."""
    p = pools(num_pages=8)
    host = HostCache(p, budget_bytes=4 * p.page_nbytes)
    host.put_pages([b"0"], [0])
    host.put_pages([b"x"], [1])                        # not asked for: evicted to make room
    placed = host.reserve([("page", k) for k in [b"0", b"1", b"2", b"3", b"4"]])
    assert [key for _, key, _ in placed] == [b"1", b"2", b"3"]   # "0" was kept; it and the batch's own took the 4
    assert not host.has("page", b"1")
    later = host.reserve([("page", b"5")])             # another batch: "0" is evictable now, those being filled not
    assert [key for _, key, _ in later] == [b"5"] and not host.has("page", b"0")
    assert host.reserve([("page", b"6")]) == []
    for _, key, views in placed + later:
        views[0].fill_(key[0])
    host.finish(placed, [key != b"2" for _, key, _ in placed])
    host.finish(later, [True])
    assert [host.has("page", k) for k in [b"1", b"2", b"3", b"4", b"5"]] == [True, False, True, False, True]
    host.load_pages([b"3"], [6])
    assert torch.equal(page_of(p, 6)[0].flatten().view(torch.uint8)[:4], torch.full((4,), ord("3"), dtype=torch.uint8))
    assert not host.has("page", b"x") and host.stats()["host_pages"] == 3 and not host.held and not host.loading


class HeldSlabs(HostCache):
    """Slabs allocated only when the test lets them through (pinning takes the OS time), recording the
    threads that allocated; refuse: the slab (0-based) the OS refuses."""
    def __init__(self, *args, refuse: int | None = None, **kwargs):
        import threading
        self.let_through, self.threads, self.refuse = threading.Event(), [], refuse
        super().__init__(*args, **kwargs)

    def _allocate(self, rows):
        import threading
        self.threads.append(threading.get_ident())
        assert self.let_through.wait(10)
        if len(self.threads) - 1 == self.refuse:
            raise RuntimeError("CUDA error: out of memory")
        return super()._allocate(rows)


def test_slabs_allocated_at_load_are_the_whole_budget_and_nothing_allocates_later(monkeypatch):
    """Pinned memory's mode (at_load): every slab of the budget is allocated on a thread of its own from construction;
    until they are there nothing is kept and nothing waits for them; afterwards no spill allocates (a full tier
    evicts)."""
    import threading
    p = pools(num_pages=8)
    monkeypatch.setattr("engine.cache.host.SLAB_BYTES", 2 * p.page_nbytes)
    host = HeldSlabs(p, budget_bytes=5 * p.page_nbytes, at_load=True)
    host.put_state(b"s", 1)
    host.put_pages([b"0"], [0])
    assert not host.has("state", b"s") and not host.has("page", b"0") and host.stats()["host_bytes"] == 0
    assert host.reserve([("page", b"r")]) == []
    host.let_through.set()
    host.wait_allocated()
    assert host.stats()["host_bytes"] == 5 * p.page_nbytes and len(host.threads) == 3      # slabs of 2, 2, 1
    host.put_state(b"s", 1)
    host.put_pages([b"0", b"1", b"2", b"3"], [0, 1, 2, 3])          # the snapshot's 2 blocks + 3 pages, then one evicts
    assert not host.has("state", b"s") and all(host.has("page", k) for k in [b"0", b"1", b"2", b"3"])
    assert len(host.threads) == 3 and threading.get_ident() not in host.threads


def test_a_slab_the_os_will_not_pin_at_load_ends_the_budget_there(monkeypatch, caplog):
    p = pools(num_pages=8)
    monkeypatch.setattr("engine.cache.host.SLAB_BYTES", 2 * p.page_nbytes)
    host = HeldSlabs(p, budget_bytes=6 * p.page_nbytes, at_load=True, refuse=1)
    host.let_through.set()
    host.wait_allocated()
    assert host.max_blocks == 2 and host.stats()["host_bytes"] == 2 * p.page_nbytes
    assert "stays at" in caplog.text and "out of memory" in caplog.text
    host.put_pages([b"0", b"1", b"2"], [0, 1, 2])
    assert [host.has("page", k) for k in [b"0", b"1", b"2"]] == [True, True, False]    # a batch keeps its first


def test_the_cache_spills_evicted_pages_and_snapshots_and_restores_a_hit_from_the_host():
    p = pools(num_pages=4, num_slots=5, page_size=4)
    cache = CacheManager(p, num_seq_slots=1, host=HostCache(p, 1 << 20))
    tokens = list(range(12))
    pages, slot = cache.admit(PrefixHit(), 12)
    cache.grow(pages, 12)
    hashes = []
    cache.index_pages(hashes, tokens, 12, pages)
    cache.snapshots.save(slot, hashes[1])
    want = [page_of(p, page) for page in pages[:2]]
    snap = p.ssm[:, slot].clone()
    cache.release(pages=pages, state_slot=slot, total_tokens=12, hashes=hashes, tokens=tokens, num_computed=12)
    other, s2 = cache.admit(PrefixHit(), 16)          # takes every page: the cached ones are evicted
    cache.grow(other, 16)
    assert cache.stats()["host_pages"] == 3 and cache.stats()["host_snapshots"] == 1
    assert cache.match_prefix(tokens + [99]).pages == [-1, -1]      # both pages now only in the host tier
    p.k.zero_()
    p.ssm.zero_()
    cache.release(pages=other, state_slot=s2, total_tokens=16, hashes=[], tokens=[], num_computed=0)
    hit = cache.match_prefix(tokens + [99])
    assert (hit.tokens, hit.snapshot) == (8, hashes[1]) and cache.can_admit(hit, 16)
    got, live = cache.admit(hit, 16)
    assert all(torch.equal(a, b) for page, w in zip(got, want) for a, b in zip(page_of(p, page), w))
    assert torch.equal(p.ssm[:, live], snap)
    assert cache.match_prefix(tokens + [99]).pages == got        # indexed on the GPU again
    assert cache.reserved == 4 - 2 and cache.stats()["prefix_hit_tokens"] == 8


@pytest.mark.gpu
def test_on_the_gpu_pinned_copies_keep_stream_order(tmp_path):
    """Pools on the GPU: the host tier's blocks are pinned and its copies queued without waiting; a page overwritten
    right after its spill, and a block reused right after a restore, still give the right bytes. The disk tier's
    write waits for its copy out of the GPU."""
    from engine.cache.disk import DiskCache, namespace
    cpu = pools(num_pages=8, int8=True)
    p = CacheTensors(**{name: (getattr(cpu, name).cuda() if name != "page_size" else cpu.page_size)
                        for name in ("k", "v", "k_scale", "v_scale", "conv", "ssm", "page_size")})
    host = HostCache(p, budget_bytes=3 * p.page_nbytes + 1)
    host.wait_allocated()
    assert host.pinned
    want = {i: [t.cpu() for t in page_of(p, i)] for i in range(3)}
    host.put_pages([b"0", b"1", b"2"], [0, 1, 2])
    p.k.fill_(7)                                        # queued after the spill
    host.load_pages([b"0", b"1", b"2"], [5, 6, 7])
    host.put_pages([b"3"], [3])                         # evicts "0" and reuses its block after the restore read it
    torch.cuda.synchronize()
    for i in range(3):
        assert all(torch.equal(a.cpu(), b) for a, b in zip(page_of(p, 5 + i), want[i]))
    disk = DiskCache(tmp_path, namespace({"gpu": True}), budget_bytes=1 << 20)
    disk.write_pages(p, [b"p" * 16], [6])
    disk.flush()
    views = [torch.zeros(p.page_nbytes, dtype=torch.uint8)]
    assert disk.read_into("page", b"p" * 16, views) and torch.equal(views[0], p.read_pages([6])[0].cpu())
    disk.close()


def three_pages_on_disk(tmp_path, snapshots: dict[int, int]):
    """(source pools, 13 tokens, the chain hashes of their 3 pages, a DiskCache holding those pages and a snapshot
    after page i (0-based) from the source's state slot snapshots[i])."""
    from engine.cache.manager import chain_hashes
    from engine.cache.disk import DiskCache, namespace
    src = pools(num_pages=4, num_slots=5, seed=1)
    tokens = list(range(13))
    keys = chain_hashes(tokens[:12], 4)
    disk = DiskCache(tmp_path, namespace({"t": 1}), budget_bytes=1 << 20)
    disk.write_pages(src, keys, [0, 1, 2])
    for i, slot in snapshots.items():
        disk.write_state(src, keys[i], slot)
    disk.flush()
    return src, tokens, keys, disk


def settled(cache: CacheManager, tokens: list[int]) -> PrefixHit:
    """match_prefix, looked up again until the disk reads it starts are done (the engine looks again each step)."""
    while (hit := cache.match_prefix(tokens)).loading:
        for future, _ in cache._loads:
            future.result(timeout=10)
    return hit


def test_a_disk_hit_bigger_than_the_host_tier_restores_what_it_can(tmp_path):
    """Three pages and snapshots after pages 1 and 3 on disk, a host tier of 4 blocks (a snapshot takes 2): the
    3-page hit cannot be held whole, so the lookup settles for the first page and its snapshot."""
    src, tokens, keys, disk = three_pages_on_disk(tmp_path, {0: 1, 2: 2})
    p = pools(num_pages=4, num_slots=5, seed=2)
    host = HostCache(p, budget_bytes=4 * p.page_nbytes)
    assert host.state_blocks == 2
    cache = CacheManager(p, num_seq_slots=1, host=host, disk=disk)
    hit = settled(cache, tokens)
    assert (hit.tokens, hit.snapshot, hit.pages) == (4, keys[0], [-1])
    pages, slot = cache.admit(hit, 13)
    assert all(torch.equal(a, b) for a, b in zip(page_of(p, pages[0]), page_of(src, 0)))
    assert torch.equal(p.conv[:, slot], src.conv[:, 1]) and torch.equal(p.ssm[:, slot], src.ssm[:, 1])
    assert disk.stats()["disk_rejected"] == 0 and cache.stats()["disk_hit_snapshots"] >= 1
    disk.close()


def test_a_disk_hit_reads_its_snapshot_beside_its_pages_in_one_batch_in_the_background(tmp_path):
    """The snapshot (the largest file) is not read after the pages: one read_many has it first, then every page. It
    runs beside the caller: the lookups meanwhile say `loading` (and read nothing again), the one after it the hit."""
    import threading
    src, tokens, keys, disk = three_pages_on_disk(tmp_path, {2: 2})
    batches, go = [], threading.Event()
    read_many = disk.read_many

    def gated(entries):
        batches.append([(kind, key) for kind, key, _ in entries])
        assert go.wait(10)
        return read_many(entries)

    disk.read_many = gated
    p = pools(num_pages=4, num_slots=5, seed=2)
    cache = CacheManager(p, num_seq_slots=1, host=HostCache(p, budget_bytes=1 << 20), disk=disk)
    assert cache.match_prefix(tokens).loading and cache.loading
    assert cache.match_prefix(tokens).loading and cache.stats()["host_pages"] == 0
    go.set()
    cache._loads[0][0].result(timeout=10)
    hit = cache.match_prefix(tokens)
    assert (hit.tokens, hit.snapshot, hit.loading) == (12, keys[2], False) and not cache.loading
    assert batches == [[("state", keys[2])] + [("page", k) for k in keys]]
    pages, slot = cache.admit(hit, 13)
    assert all(torch.equal(a, b) for i in range(3) for a, b in zip(page_of(p, pages[i]), page_of(src, i)))
    assert torch.equal(p.ssm[:, slot], src.ssm[:, 2])
    disk.close()


def test_an_entry_put_from_the_gpu_while_its_disk_read_is_in_flight_is_kept_once():
    """reserve, then the GPU evicts the same page into the tier, then the read finishes: one entry, no block lost."""
    p = pools(num_pages=4)
    host = HostCache(p, budget_bytes=3 * p.page_nbytes)
    (placed,) = host.reserve([("page", b"k")])
    assert not host.has("page", b"k") and host.loading
    host.put_pages([b"k"], [2])
    placed[2][0].fill_(7)
    host.finish([placed], [True])
    assert host.stats()["host_pages"] == 1 and not host.loading
    host.load_pages([b"k"], [0])
    assert all(torch.equal(a, b) for a, b in zip(page_of(p, 0), page_of(p, 2)))   # the GPU's copy, not the fill
    host.put_pages([b"a", b"b"], [1, 3])                 # the other two blocks are free again
    assert host.stats()["host_pages"] == 3


def test_the_pinned_memory_torch_caches_goes_back_where_torch_can(monkeypatch):
    """Engine.close gives the host tier's page-locked memory back to the OS (empty_host_cache), and an older torch
    without the call is no error."""
    import types

    from engine.core.device import empty_host_cache
    calls = []
    monkeypatch.setattr(torch, "accelerator", types.SimpleNamespace(memory=types.SimpleNamespace(
        empty_host_cache=lambda: calls.append(1))))
    empty_host_cache()
    assert calls == [1]
    monkeypatch.setattr(torch, "accelerator", types.SimpleNamespace())
    empty_host_cache()
