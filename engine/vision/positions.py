"""3-axis (t, h, w) mRoPE positions of a prompt with images, as transformers' Qwen3.5 `get_rope_index` computes them.

Text tokens advance one position on all three axes. An image's merged-patch tokens start at the next position p:
t = p + frame, h = p + row, w = p + column of the merged grid; the text after it resumes at p + max(rows, columns).
So a prompt with images ends at a position below its length: every token after the prompt (decode) sits at its
index + `delta` (negative or 0) on all three axes. Text alone gives positions 0..n-1 on each axis and delta 0: the
engine's plain path, unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.vision.processor import ImageInputError

Grid = tuple[int, int, int]   # (t, h, w) in patches, before merging


@dataclass(frozen=True)
class MRopePositions:
    """One sequence's rotary positions: the prompt's table, then index + delta."""
    table: torch.Tensor    # [3, prompt length] int64
    delta: int

    def rows(self, start: int, end: int) -> torch.Tensor:
        """Positions [3, end - start] of tokens start .. end - 1 (those past the prompt: index + delta)."""
        n = self.table.shape[1]
        beyond = torch.arange(max(start, n), max(end, n), dtype=torch.int64) + self.delta
        return torch.cat([self.table[:, start:min(end, n)], beyond.expand(3, -1)], dim=1)


def mrope_positions(tokens: list[int], image_token_id: int, grids: list[Grid], merge: int) -> MRopePositions:
    """Positions of a prompt whose i-th run of image tokens belongs to grids[i] (t * h * w / merge² tokens each,
    the placeholders already expanded: engine.vision.tokens.expand_image_placeholders)."""
    parts, pos, i, n = [], 0, 0, len(tokens)
    images = iter(grids)
    while i < n:
        if tokens[i] != image_token_id:
            j = i
            while j < n and tokens[j] != image_token_id:
                j += 1
            parts.append(torch.arange(pos, pos + j - i).expand(3, -1))
            pos, i = pos + j - i, j
            continue
        t, h, w = next(images, (0, 0, 0))
        gh, gw = h // merge, w // merge
        count = t * gh * gw
        if count == 0 or tokens[i:i + count] != [image_token_id] * count:
            raise ImageInputError("the prompt's image placeholder tokens do not match its images")
        tt, hh, ww = torch.meshgrid(torch.arange(t), torch.arange(gh), torch.arange(gw), indexing="ij")
        parts.append(torch.stack([tt, hh, ww]).reshape(3, -1) + pos)
        pos, i = pos + max(h, w) // merge, i + count
    if next(images, None) is not None:
        raise ImageInputError("the prompt has fewer image placeholders than images")
    table = torch.cat(parts, dim=1) if parts else torch.zeros(3, 0, dtype=torch.int64)
    return MRopePositions(table, int(table.max()) + 1 - n if n else 0)
