"""Where the kernels run: under Triton's CPU interpreter or on a GPU, and how many SMs it has."""

import functools
import os

import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@functools.lru_cache(maxsize=None)
def sm_count(device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count
