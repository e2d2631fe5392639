"""Programmatic dependent launch (qwendesk_kernels/pdl.py): off where it cannot run; on the GPU a chain of the decode
step's kernels replayed from a CUDA graph with PDL gives bit for bit what the same kernels give launched one after the
other without it (a kernel that read its input before waiting for the one before would read stale values)."""

import pytest
import torch

from qwendesk_kernels import pdl
from qwendesk_kernels.activation import silu_mul
from qwendesk_kernels.norm import add_rms_norm
from qwendesk_kernels.quant import int4_linear
from tests.test_kernels_quant import random_int4


def test_pdl_off_on_the_cpu_and_when_disabled(monkeypatch):
    assert pdl.launch_args(torch.device("cpu")) == {"PDL": False}
    assert not pdl.supported(torch.device("cpu"))
    monkeypatch.setattr(pdl, "ENABLED", False)
    assert pdl.launch_args(torch.device("cuda", 0)) == {"PDL": False}


@pytest.mark.gpu
def test_decode_chain_in_a_graph_is_exact_with_pdl(monkeypatch):
    if not pdl.supported(torch.device("cuda", 0)):
        pytest.skip("PDL needs sm_90+ and Triton 3.4+")
    hidden, inter = 1024, 2816
    gate_up, _ = random_int4(2 * inter, hidden, 128, torch.bfloat16, "cuda", seed=1)
    down, _ = random_int4(hidden, inter, 128, torch.bfloat16, "cuda", seed=2)
    norm_w = 0.1 * torch.randn(hidden, dtype=torch.bfloat16, device="cuda")
    x = torch.randn(1, hidden, dtype=torch.bfloat16, device="cuda")
    res = torch.randn(1, hidden, dtype=torch.bfloat16, device="cuda")

    def layers(x, res):
        for _ in range(8):                  # each output feeds the next kernel at once
            h, res = add_rms_norm(x, res, norm_w, 1e-6)
            x = int4_linear(silu_mul(int4_linear(h, gate_up)), down)
        return x, res

    def eager(x, res):
        monkeypatch.setattr(pdl, "ENABLED", False)
        try:
            return layers(x, res)
        finally:
            monkeypatch.setattr(pdl, "ENABLED", True)

    layers(x, res)                          # compile and allocate the split-K scratch outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, out_res = layers(x, res)
    for seed in range(5):
        torch.manual_seed(seed)
        x.copy_(torch.randn_like(x))
        res.copy_(torch.randn_like(res))
        graph.replay()
        want, want_res = eager(x, res)
        assert torch.equal(out, want) and torch.equal(out_res, want_res)
