"""engine/spec/rounds.py round_inputs: a round's inputs from the host's requests, as views of one buffer per dtype;
written again into a captured graph's buffers (the GPU path, here on the CPU) every field reads the new values; a
round launched from another's carry takes its base, last token, sampling step and halted flag from it."""

from array import array

import torch

from engine.core.sampling import SamplingRow
from engine.spec.rounds import RoundRequest, round_inputs

MAX_PAGES = 6


def request(i: int, temperature: float = 0.0) -> RoundRequest:
    return RoundRequest(slot=3 + i, base=100 + i, last=7 + i, pages=array("i", range(10 * i, 10 * i + i + 2)),
                        limit=112 + i, snap_slot=40 + i,
                        sampling=SamplingRow(temperature, 5 + i, 0.9 - i / 10, 0.01 * i, 1000 + i, 20 + i, i % 2 == 1),
                        delta=-i, stop=-1 if i % 2 else 9)


def assert_holds(inp, reqs: list[RoundRequest], max_pages: int = MAX_PAGES) -> None:
    pages = torch.zeros(len(reqs), max_pages, dtype=torch.int32)
    for row, r in zip(pages, reqs):
        row[:len(r.pages)] = torch.tensor(list(r.pages), dtype=torch.int32)
    assert torch.equal(inp.block_tables, pages) and inp.block_tables.is_contiguous()
    fields = dict(slots="slot", base="base", last="last", limit="limit", snap_slots="snap_slot", delta="delta",
                  stop="stop")
    for name, attr in fields.items():
        assert getattr(inp, name).tolist() == [getattr(r, attr) for r in reqs], name
    assert inp.halted.tolist() == [0] * len(reqs) and inp.slots.dtype == torch.int64
    s = inp.sampling
    for name, attr in dict(top_k="top_k", seeds="seed", steps="steps", seeded="seeded").items():
        assert getattr(s, name).tolist() == [getattr(r.sampling, attr) for r in reqs], name
    for name in ("temperature", "top_p", "min_p"):
        want = torch.tensor([getattr(r.sampling, name) for r in reqs], dtype=torch.float32)
        assert torch.equal(getattr(s, name), want), name
    assert s.seeded.dtype == torch.bool
    fields = [inp.slots, inp.base, inp.last, inp.halted, inp.block_tables, inp.limit, inp.snap_slots, inp.delta,
              inp.stop, *s.tensors()]
    assert all(f.data_ptr() % 16 == 0 for f in fields)   # as tensors of their own (Triton specializes on it)


def test_every_field_holds_its_requests_values():
    for n in (1, 2, 3, 5):                           # odd and even rows: the buffers' padding to 16 bytes
        reqs = [request(i) for i in range(n)]
        inp = round_inputs(reqs, MAX_PAGES + n % 2, "cpu")
        assert_holds(inp, reqs, MAX_PAGES + n % 2)


def test_a_graphs_buffers_take_each_rounds_inputs_in_place():
    """Captured with padding rows at bucket 4, run with 3 sequences then 2: the same tensors (what the graph reads)
    hold each round's values, padded with rows that write nothing on the pad slot."""
    pad = RoundRequest.padding(77)
    static = round_inputs([pad] * 4, MAX_PAGES, "cpu")
    buffers = {p.untyped_storage().data_ptr() for p in static.packs}
    fields = [static.slots, static.base, static.last, static.halted, static.block_tables, static.limit,
              static.snap_slots, static.delta, static.stop, *static.sampling.tensors()]
    assert len(static.packs) == 4 and all(f.untyped_storage().data_ptr() in buffers for f in fields)
    for n in (3, 2):
        reqs = [request(i, temperature=0.5) for i in range(n)]
        assert round_inputs(reqs, MAX_PAGES, "cpu", pad_to=4, pad_slot=77, out=static) is static
        assert_holds(static, reqs + [RoundRequest.padding(77)] * (4 - n))
    assert static.limit[2:].tolist() == [0, 0]         # padding rows: no pages, nothing written


def test_a_round_after_another_starts_from_its_carry():
    """The carry's rows (base, last, steps, halted) replace the requests' for the sequences, in a graph's buffers
    (padding rows keep theirs) and in new ones; every other field is the host's."""
    reqs = [request(i) for i in range(3)]
    carry = torch.tensor([[205, 206, 207], [11, 12, 13], [31, 32, 33], [0, 1, 0]])
    static = round_inputs([RoundRequest.padding(77)] * 4, MAX_PAGES, "cpu")
    for inp in (round_inputs(reqs, MAX_PAGES, "cpu", carry=carry),
                round_inputs(reqs, MAX_PAGES, "cpu", pad_to=4, pad_slot=77, out=static, carry=carry)):
        n = len(reqs)
        assert inp.base[:n].tolist() == [205, 206, 207] and inp.last[:n].tolist() == [11, 12, 13]
        assert inp.sampling.steps[:n].tolist() == [31, 32, 33] and inp.halted[:n].tolist() == [0, 1, 0]
        assert inp.slots[:n].tolist() == [3, 4, 5] and inp.limit[:n].tolist() == [112, 113, 114]
        assert inp.sampling.seeds[:n].tolist() == [1000, 1001, 1002]
    assert static.base[3].item() == 0 and static.halted[3].item() == 0 and static.slots[3].item() == 77
