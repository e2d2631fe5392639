"""Kernels for the Qwen3.5-family decoder: each op has a torch reference (`*_ref`, the CPU path and
the test oracle) beside its Triton kernel."""
