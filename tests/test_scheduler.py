"""Scheduler on its own (a CacheManager over a tiny CacheTensors on the CPU, pages of 4 tokens, no model): admission
order and what blocks it, reservations back to zero, the snapshot boundary, chunked prefill planning and prefix reuse
across requests. The tests do what the engine does around it: advance num_computed as the runner would, index pages."""

from engine.cache.manager import CacheManager
from engine.core.params import SamplingParams
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence
from qwendesk_kernels.gdn import RECURRENT_MAX_TOKENS

PAGE = 4
IM = 1000          # the <|im_start|> token


def seq(i, prompt, new_tokens=4):
    prompt = list(range(100, 100 + prompt)) if isinstance(prompt, int) else prompt
    return Sequence(id=i, prompt=prompt, params=SamplingParams(max_tokens=new_tokens), seed=0,
                    max_total=len(prompt) + new_tokens)


def scheduler(tiny_pools, num_pages=32, num_slots=8, running=2, chunk=64, seq_slots=None):
    cache = CacheManager(tiny_pools(num_pages, num_slots, PAGE), num_seq_slots=seq_slots or running)
    return Scheduler(cache, max_running=running, prefill_chunk=chunk, im_start_id=IM)


def compute(sched, s, n):
    """What the engine does after the runner ran n more tokens of s."""
    s.num_computed += n
    sched.cache.index_pages(s.hashes, s.tokens, s.num_computed, s.pages)


def decode(sched, s, token):
    """A token sampled (accepted), then a decode step that runs it."""
    s.append(token)
    sched.cache.grow(s.pages, s.num_computed + 1)
    compute(sched, s, 1)


def assert_nothing_held(sched):
    cache = sched.cache
    assert cache.reserved == 0 and cache.available_pages() == cache.num_pages
    assert cache.stats()["kv_pages_used"] == 0 and cache.stats()["state_slots_used"] == 0


def test_admission_is_first_come_first_served_and_waits_for_pages(tiny_pools):
    sched = scheduler(tiny_pools, num_pages=10, running=4)
    big, bigger, small = seq(0, 20, 4), seq(1, 20, 4), seq(2, 2, 2)      # 6, 6 and 1 pages
    for s in (big, bigger, small):
        sched.add(s)
    assert sched.admit() == [big]                # 4 pages left: `bigger` waits, and `small` behind it too
    assert list(sched.waiting) == [bigger, small] and sched.running == [big]
    assert len(big.pages) == 5 and big.state_slot == 0 and big.num_computed == 0    # pages for the prompt so far
    assert sched.cache.reserved == 1 and sched.admit() == []
    sched.remove(big)
    assert sched.admit() == [bigger, small] and not sched.waiting
    assert bigger.state_slot == 0 and small.state_slot == 1


def test_admission_waits_for_a_running_place_and_a_state_slot(tiny_pools):
    sched = scheduler(tiny_pools, running=2)
    seqs = [seq(i, 5) for i in range(3)]
    for s in seqs:
        sched.add(s)
    assert sched.admit() == seqs[:2] and list(sched.waiting) == seqs[2:]
    slots = scheduler(tiny_pools, running=2, seq_slots=1)       # one state slot for two running places
    for s in [seq(i, 5) for i in range(2)]:
        slots.add(s)
    assert len(slots.admit()) == 1 and len(slots.waiting) == 1


def test_everything_held_is_given_back_whether_finished_or_cancelled(tiny_pools):
    sched = scheduler(tiny_pools, running=4)
    seqs = [seq(i, n, 6) for i, n in enumerate((3, 9, 17))]
    for s in seqs:
        sched.add(s)
    sched.admit()
    compute(sched, seqs[0], 3)
    for t in range(6):
        decode(sched, seqs[0], t)                # finished: 9 tokens computed
    compute(sched, seqs[1], 4)                   # cancelled mid-prompt
    for s in seqs:
        sched.remove(s)
        assert s.pages == [] and s.state_slot == -1 and s.rolling_slot == -1
    assert not sched.running and not sched.has_work()
    assert_nothing_held(sched)
    assert sched.cache.stats()["kv_pages_cached"] == 3    # the full pages computed: 2 of the first, 1 of the second


def test_removing_a_waiting_request_touches_no_cache(tiny_pools):
    sched = scheduler(tiny_pools, running=1)
    first, second = seq(0, 5), seq(1, 5)
    sched.add(first)
    sched.add(second)
    sched.admit()
    before = sched.cache.stats(), sched.cache.reserved
    sched.remove(second)
    assert not sched.waiting and (sched.cache.stats(), sched.cache.reserved) == before


def test_the_snapshot_boundary_is_the_page_before_the_last_im_start(tiny_pools):
    sched = scheduler(tiny_pools, running=4)
    chat = [5] * 6 + [IM] + [6] * 7 + [IM] + [7] * 3            # the last <|im_start|> at 14
    plain = seq(1, 11)                                           # no <|im_start|>: the page before the last token
    tiny = seq(2, 3)                                             # no page boundary inside the prompt
    for s in (seq(0, chat), plain, tiny):
        sched.add(s)
    first = sched.admit()[0]
    assert first.snapshot_at == 12 and plain.snapshot_at == 8 and tiny.snapshot_at == -1


def test_a_short_step_takes_its_snapshots_in_passing(tiny_pools):
    sched = scheduler(tiny_pools, running=4, chunk=24)
    a, b, c = seq(0, 13), seq(1, 9), seq(2, 10)        # boundaries 12, 8, 8
    for s in (a, b, c):
        sched.add(s)
    sched.admit()
    seqs, lens, cuts = sched.prefill_batch()
    assert seqs == [a, b, c] and lens == [13, 9, 2] and cuts == [12, 8, 0]     # the chunk cuts c at 2 tokens
    for s, n in zip(seqs, lens):
        compute(sched, s, n)
    seqs, lens, cuts = sched.prefill_batch()
    assert seqs == [c] and lens == [8] and cuts == [6]
    compute(sched, c, 8)
    assert sched.prefill_batch() == ([], [], []) and sched.decode_batch() == [a, b, c]
    b.finish_reason = "stop"
    assert sched.decode_batch() == [a, c]


def test_a_snapshot_less_than_a_page_into_the_step_ends_the_step_there(tiny_pools):
    """The snapshot in passing gathers the conv window from the step's own rows: at least a page of them."""
    sched = scheduler(tiny_pools, running=1, chunk=6)
    s = seq(0, 14)                                      # boundary 12
    sched.add(s)
    sched.admit()
    assert sched.prefill_batch() == ([s], [6], [0])
    compute(sched, s, 6)
    assert sched.prefill_batch() == ([s], [6], [0])     # the boundary is at the step's last token: not inside it
    compute(sched, s, 6)
    assert s.num_computed == s.snapshot_at == 12        # the engine copies the state here
    assert sched.prefill_batch() == ([s], [2], [0])
    t = seq(1, 15)                                      # boundary 12, two tokens into the second step
    sched.remove(s)
    sched.add(t)
    sched.admit()
    compute(sched, t, 10)
    assert sched.prefill_batch() == ([t], [2], [0])     # stops at the boundary instead


def test_a_long_step_stops_at_the_snapshot_boundary(tiny_pools):
    """Past RECURRENT_MAX_TOKENS the chunked GDN kernel keeps no state inside a step: the step ends at the
    boundary and the engine copies the state."""
    n = RECURRENT_MAX_TOKENS + 100
    sched = scheduler(tiny_pools, num_pages=n // PAGE + 8, running=2, chunk=2 * n)
    s = seq(0, [3] * (n - 40) + [IM] + [4] * 39)        # boundary n - 40
    short = seq(1, 20)                                  # boundary 16
    sched.add(s)
    sched.add(short)
    sched.admit()
    assert sched.prefill_batch() == ([s, short], [n - 40, 16], [0, 0])
    compute(sched, s, n - 40)
    compute(sched, short, 16)
    assert s.num_computed == s.snapshot_at and short.num_computed == short.snapshot_at
    assert sched.prefill_batch() == ([s, short], [40, 4], [0, 0])


def test_a_second_turn_reuses_the_first_turns_prompt_and_end_of_turn_snapshots(tiny_pools):
    sched = scheduler(tiny_pools, num_pages=40, num_slots=8, running=2)
    pools, cache = sched.cache.pools, sched.cache
    turn1 = [5] * 10 + [IM] + [6] * 9                   # boundary 8
    first = seq(0, turn1, 12)
    sched.add(first)
    sched.admit()
    compute(sched, first, 8)
    pools.conv[0, first.state_slot] = pools.ssm[0, first.state_slot] = 8.0
    cache.snapshots.save(first.state_slot, first.hashes[1])     # what the engine does at the boundary
    compute(sched, first, 12)
    for t in range(12):                                 # decode passes the page boundaries at 24 and 28
        decode(sched, first, 50 + t)
        if first.num_computed % PAGE == 0:
            pools.conv[0, first.state_slot] = pools.ssm[0, first.state_slot] = float(first.num_computed)
            first.rolling_slot = cache.snapshots.roll(first.state_slot, first.rolling_slot)
    assert first.num_computed == 32 and first.rolling_slot >= 0
    sched.remove(first)                                 # the rolling snapshot becomes the end-of-turn snapshot
    assert_nothing_held(sched)
    assert len(cache.snapshots) == 2 and first.hashes[-1] in cache.snapshots

    again = seq(1, turn1[:15] + [IM, 7, 7])             # diverges in the fourth page: the prompt's snapshot serves
    next_turn = seq(2, first.tokens + [IM, 9, 9])       # follows the whole first turn: the end-of-turn one serves
    sched.add(again)
    sched.add(next_turn)
    assert sched.admit() == [again, next_turn]
    assert again.cached_tokens == again.num_computed == 8 and again.pages[:2] == next_turn.pages[:2]
    assert pools.conv[0, again.state_slot].item() == 8.0
    assert again.snapshot_at == 12                      # past what the prefix cache gave: a new snapshot there
    assert next_turn.cached_tokens == 32 and pools.conv[0, next_turn.state_slot].item() == 32.0
    assert next_turn.snapshot_at == -1                  # its last <|im_start|> is at 32: nothing new to snapshot
    assert sched.prefill_batch() == ([again, next_turn], [10, 3], [4, 0])
    assert cache.stats()["prefix_hit_tokens"] == 40


def test_a_request_whose_prefix_is_loading_steps_aside_and_is_looked_up_again_only_after_a_read(tiny_pools,
                                                                                                 monkeypatch):
    """A loading hit (the disk tier reading its prefix) keeps the request's place while the one behind it is
    admitted; it is not looked up again (a whole prompt's hashes) until some read has finished."""
    from engine.cache.manager import PrefixHit
    sched = scheduler(tiny_pools)
    restored, behind = seq(0, 12), seq(1, 8)
    lookups, loading = [], {restored.id}

    def match_prefix(tokens):
        lookups.append(tokens)
        return PrefixHit(loading=True) if tokens == restored.hash_tokens and restored.id in loading else PrefixHit()

    monkeypatch.setattr(sched.cache, "match_prefix", match_prefix)
    sched.add(restored)
    sched.add(behind)
    assert sched.admit() == [behind] and list(sched.waiting) == [restored]
    assert sched.admit() == [] and len(lookups) == 2                  # not looked up again: no read has finished
    sched.cache.reads_done += 1                                       # (a read batch was kept)
    loading.clear()
    assert sched.admit() == [restored] and len(lookups) == 3


def test_with_a_drafters_rings_a_snapshot_far_before_the_steps_end_ends_the_step_there(tiny_pools):
    """A block drafter's rings are copied into a snapshot taken in passing after the step: they still hold the
    window before the boundary only if the step ran at most CacheTensors.snapshot_tail rows past it. Further, the
    step stops at the boundary (the engine copies the state there, rings included)."""
    import torch
    pools = tiny_pools(32, 8)
    pools.ring_k = torch.zeros(1, 8, 12, 1, 1)           # a ring of 12 tokens for a window of 5: a tail of 8
    pools.ring_v = torch.zeros(1, 8, 12, 1, 1)
    pools.draft_rings, pools.draft_window = (True,), 5
    assert pools.snapshot_tail == 8
    sched = Scheduler(CacheManager(pools, num_seq_slots=2), max_running=1, prefill_chunk=64, im_start_id=IM)
    near, far = seq(0, [5] * 9 + [IM] + [6] * 6), seq(1, [5] * 9 + [IM] + [6] * 7)    # boundary 8; 8 / 9 rows past it
    sched.add(near)
    sched.admit()
    assert sched.prefill_batch() == ([near], [16], [8])   # in passing
    sched.remove(near)
    sched.add(far)
    sched.admit()
    assert sched.prefill_batch() == ([far], [8], [0])     # stops at the boundary
