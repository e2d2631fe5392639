"""ForwardBatch: everything one forward pass needs besides token ids and weights.

Sequences are packed back to back (varlen): token rows [T], sequence i owns rows
cu_seqlens[i]:cu_seqlens[i+1]. The same layout serves prefill chunks, decode (one row per
sequence) and speculative verify (k+1 rows per sequence). A prefill step over image tokens
also carries their embeddings (the vision tower's output), which replace the token embeddings
of those rows.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from qwendesk_kernels.gdn import VerifyRows

if TYPE_CHECKING:
    from engine.vision.positions import MRopePositions

MAX_DECODE_LEN = 16  # rows per sequence the decode kernels take (1, or k+1 for speculative verify: up to a block
#                      drafter's 15 drafts; attention splits more than 64 rows x heads into row tiles)


@dataclass
class StateSnapshot:
    """Also save GDN state inside a prefill step: after the first tokens[i] rows of sequence i (0: not this one)
    into slots[i], for prefix reuse at a page boundary without ending the step there."""
    tokens: torch.Tensor         # [N] int32
    slots: torch.Tensor          # [N] int64 (unused where tokens is 0)
    conv_rows: torch.Tensor      # [S, W-1] int64: packed rows forming each saved conv window (S: tokens > 0)
    conv_slots: torch.Tensor     # [S] int64: their slots


@dataclass
class ForwardBatch:
    positions: torch.Tensor      # [3, T] int64: t/h/w rotary positions (equal rows for text)
    cu_seqlens: torch.Tensor     # [N+1] int32: query rows of each sequence
    seq_lens: torch.Tensor       # [N] int32: tokens of each sequence after this step (cached + new)
    has_state: torch.Tensor      # [N] bool: the sequence has earlier tokens (GDN state is live)
    state_slots: torch.Tensor    # [N] int64: GDN conv/recurrent state slot of each sequence
    block_tables: torch.Tensor   # [N, max_pages] int32: KV pages of each sequence
    slot_mapping: torch.Tensor   # [T] int64: flat KV slot (page * page_size + offset) of each row
    logits_rows: torch.Tensor | None = None  # rows whose logits are wanted (None: every row)
    decode_len: int = 0          # L: every sequence has exactly L rows and the decode kernels run them; 0: prefill
    max_seq_len: int = 0         # upper bound of seq_lens (sizes the decode attention grid)
    snapshot: StateSnapshot | None = None
    verify: VerifyRows | None = None  # speculative verify: GDN layers keep their state, fill these rows (stacked)
    image_rows: torch.Tensor | None = None    # [R] int64: rows whose input embedding is an image's (None: none)
    image_embeds: torch.Tensor | None = None  # [R, hidden]: those embeddings, in the order of image_rows


def page_table(tables: Sequence[Sequence[int]], width: int) -> torch.Tensor:
    """[N, width] int32 on the host: each sequence's pages, zero-padded. A page table is an int32 array
    (CacheManager.admit), copied as one block: a row of 2,048 pages (128K tokens) in ~1 us, where a list took ~150."""
    out = torch.zeros(len(tables), width, dtype=torch.int32)
    for row, pages in zip(out, tables):
        if len(pages):
            row[:len(pages)] = torch.frombuffer(pages if isinstance(pages, array) else array("i", pages),
                                                dtype=torch.int32)
    return out


def build_batch(
    query_lens: list[int],
    cached_lens: list[int],
    state_slots: list[int],
    page_tables: Sequence[Sequence[int]],   # PageTables (int32 arrays) or lists
    page_size: int,
    device: torch.device | str,
    last_only: bool = True,
    positions: torch.Tensor | None = None,
    snapshots: list[tuple[int, int]] | None = None,
    conv_width: int = 0,
    decode_len: int | None = None,
    mrope: list[MRopePositions | None] | None = None,
    image_rows: list[list[int]] | None = None,
    image_embeds: torch.Tensor | None = None,
) -> ForwardBatch:
    """Build a ForwardBatch from per-sequence host lists (text positions unless given). mrope: per sequence its
    3-axis positions (engine.vision.positions; None: text), the rows of this step taken from them. image_rows: per
    sequence the rows of its step (0 = its first) that take image_embeds' rows, in order. snapshots: per sequence
    (tokens, slot) for a StateSnapshot, tokens 0 for none; each saved prefix holds at least conv_width - 1 rows.
    decode_len: rows per sequence for the decode kernels (speculative verify: k + 1); None: 1 when every sequence
    has one row (decode), else the prefill kernels. A prompt's short last step (2..8 rows) takes the prefill kernels:
    the decode kernels compile a variant per row count, seconds on its first use."""
    if decode_len is None:
        decode_len = 1 if all(n == 1 for n in query_lens) else 0
    assert decode_len == 0 or (decode_len <= MAX_DECODE_LEN and all(n == decode_len for n in query_lens))
    cu = [0]
    for n in query_lens:
        cu.append(cu[-1] + n)
    assert all(len(t) * page_size >= c + n for n, c, t in zip(query_lens, cached_lens, page_tables)), "pages missing"
    tables = page_table(page_tables, max((len(t) for t in page_tables), default=0) or 1)
    pos = torch.cat([torch.arange(c, c + n) for n, c in zip(query_lens, cached_lens)])       # [T]: no loop per row
    seq_of_row = torch.repeat_interleave(torch.arange(len(query_lens)), torch.tensor(query_lens))
    slot_map = tables[seq_of_row, pos // page_size].long() * page_size + pos % page_size
    if mrope is not None and any(m is not None for m in mrope):
        assert positions is None
        positions = torch.cat([torch.arange(c, c + n).expand(3, -1) if m is None else m.rows(c, c + n)
                               for n, c, m in zip(query_lens, cached_lens, mrope)], dim=1)
    if positions is None:
        positions = pos.unsqueeze(0).expand(3, -1)
    rows = None
    if image_rows is not None and any(image_rows):
        rows = torch.tensor([cu[i] + r for i, seq_rows in enumerate(image_rows) for r in seq_rows], dtype=torch.int64)
        assert image_embeds is not None and image_embeds.shape[0] == rows.shape[0]
    dev = torch.device(device)
    snapshot = None
    if snapshots and any(t for t, _ in snapshots):
        saved = [(cu[i] + t, slot) for i, (t, slot) in enumerate(snapshots) if t]
        assert all(0 < t < n and t >= conv_width - 1 for (t, _), n in zip(snapshots, query_lens) if t)
        snapshot = StateSnapshot(
            tokens=torch.tensor([t for t, _ in snapshots], dtype=torch.int32, device=dev),
            slots=torch.tensor([max(slot, 0) for _, slot in snapshots], dtype=torch.int64, device=dev),
            conv_rows=torch.tensor([list(range(end - conv_width + 1, end)) for end, _ in saved], dtype=torch.int64,
                                   device=dev),
            conv_slots=torch.tensor([slot for _, slot in saved], dtype=torch.int64, device=dev))
    return ForwardBatch(
        positions=positions.to(dev),
        cu_seqlens=torch.tensor(cu, dtype=torch.int32, device=dev),
        seq_lens=torch.tensor([c + n for n, c in zip(query_lens, cached_lens)], dtype=torch.int32, device=dev),
        has_state=torch.tensor([c > 0 for c in cached_lens], dtype=torch.bool, device=dev),
        state_slots=torch.tensor(state_slots, dtype=torch.int64, device=dev),
        block_tables=tables.to(dev),
        slot_mapping=slot_map.to(dev),
        logits_rows=torch.tensor(cu[1:], dtype=torch.int64, device=dev) - 1 if last_only else None,
        decode_len=decode_len,
        max_seq_len=max(c + n for n, c in zip(query_lens, cached_lens)),
        snapshot=snapshot,
        image_rows=None if rows is None else rows.to(dev),
        image_embeds=None if rows is None or image_embeds is None else image_embeds.to(dev),
    )
