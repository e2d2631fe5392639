"""The MoE routing kernel against its torch reference (the interpreter on the CPU; bf16 at the 35B-A3B's 256 + 1
experts on a GPU)."""

import pytest
import torch

from kernels.moe_route import moe_route, moe_route_ref, moe_route_triton

pytestmark = pytest.mark.usefixtures("poisoned_outputs")   # see tests/conftest.py

TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def check(out, ref, tol):
    """Close to the reference relative to its largest magnitude (the output's rounding scale)."""
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol * ref.float().abs().max().item())


# ---------------------------------------------------------------------------------------------------- routing

@pytest.mark.parametrize("T,E,k,shared,dtype", [
    (1, 8, 2, True, torch.float32), (5, 6, 3, False, torch.float32), (8, 33, 8, True, torch.float16),
    (20, 256, 8, True, torch.float16), (3, 5, 5, False, torch.float32)])
def test_route(T, E, k, shared, dtype):
    """Ids equal (ties included: half the logits repeat another's exactly), weights as the reference rounds them."""
    gen = torch.Generator().manual_seed(T + E)
    logits = torch.randn(T, E + shared, generator=gen)
    logits[:, 1:E:2] = logits[:, 0:E - 1:2]                   # exact ties between experts 2e and 2e + 1
    logits = logits.to(dtype)
    ids, weights = moe_route_triton(logits, k, shared)
    ref_ids, ref_weights = moe_route_ref(logits, k, shared)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32 and ids.shape == (T, k + shared)
    assert torch.equal(ids, ref_ids)
    check(weights, ref_weights, TOL[dtype])


def test_route_ties_go_to_the_lower_id_and_cpu_is_the_reference():
    logits = torch.tensor([[0.0, 2.0, 1.0, 2.0, 1.0, -1.0, 0.3], [3.0, 3.0, 3.0, 0.0, 0.0, 0.0, -1.0]])
    ids, weights = moe_route_triton(logits, 3, shared=True)
    assert ids.tolist() == [[1, 3, 2, 6], [0, 1, 2, 6]]
    assert torch.equal(moe_route(logits, 3, shared=True)[0], ids)
    assert torch.allclose(weights[:, 3], torch.sigmoid(logits[:, 6]))


# ---------------------------------------------------------------------------------------------------- GPU

@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 2, 8, 300])
def test_route_gpu(T):
    gen = torch.Generator("cuda").manual_seed(T)
    logits = torch.randn(T, 256 + 1, device="cuda", generator=gen).bfloat16()
    ids, weights = moe_route(logits, 8, shared=True)
    ref_ids, ref_weights = moe_route_ref(logits, 8, shared=True)
    assert torch.equal(ids, ref_ids)
    check(weights, ref_weights, TOL[torch.bfloat16])
