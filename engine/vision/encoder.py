"""ImageEncoder: the vision tower where the memory plan put it, turning one image into its prompt rows' embeddings.

Resident: the tower lives on the device. On demand: its weights live in page-locked host memory and go up to the
device for each encode (the planner counts them inside the workspace, which encoding and prefill share since they
never run at once), then the device copies are dropped: an image costs no context.
"""

from __future__ import annotations

import torch

from engine.vision.processor import ProcessedImage
from engine.vision.tower import VisionTower


class ImageEncoder:
    def __init__(self, tower: VisionTower, device: torch.device, placement: str):
        """tower: on `device` when resident, on the CPU when on demand (it is pinned here)."""
        assert placement in ("resident", "on_demand")
        self.tower, self.device, self.placement = tower, torch.device(device), placement
        self.encoded = 0                           # images encoded so far (stats)
        self._host: list[tuple[dict, str, torch.Tensor]] = []
        if placement == "on_demand":
            pin = torch.cuda.is_available()
            for module in tower.modules():
                for table in (module._parameters, module._buffers):
                    for name, t in table.items():
                        if t is not None:
                            host = t.detach().cpu()
                            self._host.append((table, name, host.pin_memory() if pin else host))
            self._place(lambda host: host)

    def _place(self, fn) -> None:
        for table, name, host in self._host:
            t = fn(host)
            if isinstance(table[name], torch.nn.Parameter):
                table[name].data = t
            else:
                table[name] = t

    @torch.inference_mode()
    def encode(self, image: ProcessedImage) -> torch.Tensor:
        """[image.num_tokens, LM hidden] in the tower's dtype, on the device."""
        if self.placement == "on_demand":
            self._place(lambda host: host.to(self.device, non_blocking=True))
        try:
            out = self.tower(image.pixel_values.to(self.device, non_blocking=True), [image.grid])
        finally:
            if self.placement == "on_demand":
                self._place(lambda host: host)     # the device copies go back to the allocator's cache
        self.encoded += 1
        return out
