"""ImageEncoder: the vision tower where the memory plan put it, turning one image into its prompt rows' embeddings.

Resident: the tower lives on the device. On demand: its weights live in page-locked host memory and go up to the
device while an image is being encoded (the planner counts them inside the workspace, which encoding and prefill
share), then the device copies are dropped: an image costs no context.

An image is encoded in stages (`start` -> `Encoding.advance` once per engine step): at most about
TOWER_PATCHES_PER_STEP patches x stages of tower work a step, so a large image does not hold up the other requests'
decode for its whole encode (a 1024² image, 4,096 patches, is one step; the largest, 65,536 patches, a block a step).
"""

from __future__ import annotations

import torch

from engine.core.device import pinned
from engine.vision.processor import ProcessedImage
from engine.vision.tower import VisionTower

TOWER_PATCHES_PER_STEP = 32 * 4096     # patches x stages of tower work per engine step (~30 ms of an H200 at 27B)


class ImageEncoder:
    def __init__(self, tower: VisionTower, device: torch.device, placement: str):
        """tower: on `device` when resident, on the CPU when on demand (it is pinned here)."""
        assert placement in ("resident", "on_demand")
        self.tower, self.device, self.placement = tower, torch.device(device), placement
        self.encoded = 0                           # images encoded so far (stats)
        self._open = 0                             # encodings in progress (on demand: the weights are up meanwhile)
        self._host: list[tuple[dict, str, torch.Tensor]] = []
        if placement == "on_demand":
            for module in tower.modules():
                for table in (module._parameters, module._buffers):
                    for name, t in table.items():
                        if t is not None:
                            self._host.append((table, name, pinned(t.detach().cpu())))
            self._place(lambda host: host)

    def _place(self, fn) -> None:
        for table, name, host in self._host:
            t = fn(host)
            if isinstance(table[name], torch.nn.Parameter):
                table[name].data = t
            else:
                table[name] = t

    def encode(self, image: ProcessedImage) -> torch.Tensor:
        """[image.num_tokens, LM hidden] in the tower's dtype, on the device: all stages at once."""
        encoding = self.start(image)
        while (out := encoding.advance(stages=None)) is None:
            pass
        return out

    @torch.inference_mode()
    def start(self, image: ProcessedImage) -> Encoding:
        if self.placement == "on_demand" and self._open == 0:
            self._place(lambda host: host.to(self.device, non_blocking=True))
        self._open += 1
        stages = self.tower.stages(image.pixel_values.to(self.device, non_blocking=True), [image.grid])
        return Encoding(self, stages, max(1, TOWER_PATCHES_PER_STEP // image.pixel_values.shape[0]))

    def _closed(self, finished: bool) -> None:
        self._open -= 1
        self.encoded += finished
        if self.placement == "on_demand" and self._open == 0:
            self._place(lambda host: host)         # the device copies go back to the allocator's cache


class Encoding:
    """One image's encoding in progress (ImageEncoder.start)."""

    def __init__(self, encoder: ImageEncoder, stages, per_step: int):
        self.encoder, self.stages, self.per_step = encoder, stages, per_step
        self.open = True

    @torch.inference_mode()
    def advance(self, stages: int | None = -1) -> torch.Tensor | None:
        """Run the next `stages` stages of the tower (-1: this image's share of a step, None: all): the image's
        embeddings once the last has run, else None."""
        n = self.per_step if stages == -1 else stages
        done = 0
        while n is None or done < n:
            try:
                next(self.stages)
            except StopIteration as end:
                self._close(finished=True)
                return end.value
            done += 1
        return None

    def close(self) -> None:
        """Give up (the request went away): what the stages hold is dropped."""
        if self.open:
            self.stages.close()
            self._close(finished=False)

    def _close(self, finished: bool) -> None:
        self.open = False
        self.encoder._closed(finished)
