"""The Triton sampling step and logprobs against the torch references.

CPU: the kernels run in the interpreter on small vocabularies (shrunken chunks and record caps, so the
multi-chunk merge and the capped fallback walk both run). GPU: V = 248320 at batch 8+, CUDA-graph replay.
"""

import pytest
import torch
import triton
import triton.language as tl

from qwendesk_kernels.sampling import (Penalties, _log, apply_penalties_ref, filtered_probs_ref, random_uniform_ref,
                              sample,
                              token_mask, token_mask_ref, token_mask_triton,
                              sample_ref, sample_triton, token_logprobs, token_logprobs_triton, top_logprobs_ref)


pytestmark = pytest.mark.usefixtures("poisoned_outputs")   # see tests/conftest.py


MIXES = {   # per row: (temperature, top_k, top_p, min_p), cycled over the batch
    "greedy": [(0.0, 0, 1.0, 0.0), (0.0, 5, 0.5, 0.1)],
    "plain": [(1.0, 0, 1.0, 0.0), (0.7, 0, 1.0, 0.0), (1.8, 0, 1.0, 0.0)],
    "top_k": [(1.0, 1, 1.0, 0.0), (1.0, 5, 1.0, 0.0), (0.8, 40, 1.0, 0.0), (1.0, 100000, 1.0, 0.0)],
    "top_p": [(1.0, 0, 0.9, 0.0), (1.0, 0, 0.5, 0.0), (0.6, 0, 0.95, 0.0), (1.0, 0, 0.01, 0.0)],
    "min_p": [(1.0, 0, 1.0, 0.05), (1.0, 0, 1.0, 0.3), (1.5, 0, 1.0, 1.0)],
    "mixed": [(0.7, 20, 0.95, 0.0), (1.0, 50, 0.8, 0.05), (1.3, 0, 0.9, 0.02), (0.0, 20, 0.9, 0.0),
              (0.05, 10, 0.9, 0.0), (5.0, 200, 0.7, 0.01), (1.0, 0, 0.0, 0.0)],
    "capped": [(1.0, 3, 1.0, 0.0), (1.0, 10, 0.9, 0.0), (1.0, 30, 1.0, 0.0), (1.0, 0, 0.3, 0.0),
               (1.0, 0, 0.1, 0.0), (2.0, 60, 1.0, 0.0), (1.0, 0, 1.0, 0.5), (0.7, 100, 0.7, 0.0)],
    "ties": [(1.0, 1, 1.0, 0.0), (1.0, 2, 1.0, 0.0), (1.0, 3, 1.0, 0.0), (1.0, 5, 1.0, 0.0), (1.0, 8, 1.0, 0.0),
             (1.0, 0, 0.2, 0.0), (1.0, 0, 0.5, 0.0), (1.0, 4, 0.6, 0.0), (1.0, 0, 1.0, 0.9)],
}


def batch(B, V, mix, device="cpu", scale=2.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, V, generator=g) * scale
    rows = [MIXES[mix][i % len(MIXES[mix])] for i in range(B)]
    params = dict(
        temperature=torch.tensor([r[0] for r in rows]),
        top_k=torch.tensor([r[1] for r in rows]),
        top_p=torch.tensor([r[2] for r in rows]),
        min_p=torch.tensor([r[3] for r in rows]),
        seeds=torch.randint(-2**62, 2**62, (B,), generator=g),
        steps=torch.randint(0, 10_000, (B,), generator=g),
    )
    return logits.to(device), {k: v.to(device) for k, v in params.items()}


def penalties_for(logits):
    """Penalty state that decides tokens: each row penalises its own top-3 tokens, rows cycling through
    presence only, frequency only (counts 1, 2, 1), repetition from the prompt only, and all three."""
    B, V = logits.shape
    top = logits.topk(3, dim=-1).indices.cpu()
    counts = torch.zeros(B, V, dtype=torch.int32)
    prompt = torch.zeros(B, V, dtype=torch.bool)
    kind = torch.arange(B) % 4
    for b in range(B):
        if kind[b] == 2:
            prompt[b, top[b]] = True
        else:
            counts[b, top[b]] = torch.tensor([1, 2, 1], dtype=torch.int32)
    presence = torch.tensor([3.0, 0.0, 0.0, 0.5])[kind]
    frequency = torch.tensor([0.0, 1.5, 0.0, 0.4])[kind]
    repetition = torch.tensor([1.0, 1.0, 2.0, 1.6])[kind]
    return Penalties(*(t.to(logits.device) for t in (counts, prompt, presence, frequency, repetition)))


def reference(logits, params, penalties=None):
    if penalties is not None:
        logits = apply_penalties_ref(logits.clone(), penalties.output_counts.float(), *penalties[1:])
    return sample_ref(logits, **params)


# ---------------------------------------------------------------------------------------------------- CPU

@pytest.mark.parametrize("mix", list(MIXES))
def test_sample_matches_ref(mix):
    logits, params = batch(12, 2000, mix, scale=3.0)
    assert torch.equal(sample_triton(logits, **params, chunk=1024), reference(logits, params))


@pytest.mark.parametrize("chunk,cap,global_cap,seed", [(128, 32, 64, 1), (128, 2, 8, 0), (256, 2, 4, 1),
                                                       (256, 1, 1, 0)])
def test_sample_small_chunks_and_caps(chunk, cap, global_cap, seed):
    """Many chunks through the merge; caps so small that record lists are cut and rows must notice it and
    finish with the exact walk (the seeds give batches where a record left out beats every kept pivot)."""
    logits, params = batch(12, 1000, "capped", scale=1.0, seed=seed)
    got = sample_triton(logits, **params, chunk=chunk, cap=cap, global_cap=global_cap)
    assert torch.equal(got, reference(logits, params))


@pytest.mark.parametrize("scale", [0.3, 8.0])
def test_sample_flat_and_peaked(scale):
    logits, params = batch(12, 2500, "mixed", scale=scale, seed=2)
    assert torch.equal(sample_triton(logits, **params, chunk=1024), reference(logits, params))


def test_sample_ties_and_masked_tokens():
    """Logits with many exact ties (ranked by id, as the stable sort does; a top-k / top-p boundary lands
    inside a tie group) and -inf tokens."""
    logits, params = batch(18, 600, "ties", scale=1.0, seed=3)
    logits = (logits * 1.5).round()
    logits[:, 550:] = float("-inf")
    logits[::3, :300] = float("-inf")
    zeros = [0, 5, 9, 14]                  # -0.0 and +0.0 on top: equal, so the lower id ranks first
    logits[zeros] = -logits[zeros].abs() - 1
    logits[zeros, 40] = -0.0
    logits[zeros, 70] = 0.0
    assert torch.equal(sample_triton(logits, **params, chunk=512), reference(logits, params))
    assert torch.equal(sample_triton(logits, **params, chunk=512, cap=2, global_cap=2), reference(logits, params))


def test_sample_penalties():
    """Greedy and sampled rows, positive and negative logits, each penalty on its own and all together."""
    logits, params = batch(16, 1500, "mixed", scale=2.0, seed=4)
    logits[1::2] -= 30.0                                                  # rows of negative logits
    params["temperature"][torch.arange(16) // 4 % 2 == 0] = 0.0           # greedy rows see every penalty
    pen = penalties_for(logits)
    got = sample_triton(logits, **params, penalties=pen, chunk=512)
    assert torch.equal(got, reference(logits, params, pen))
    assert (got != reference(logits, params)).sum() >= 6                  # the penalties did change tokens
    assert torch.equal(sample(logits, **params, penalties=pen), got)      # CPU dispatch: the references


def test_sample_seeded_determinism():
    logits, params = batch(8, 600, "mixed", seed=5)
    first = sample_triton(logits, **params, chunk=512)
    assert torch.equal(sample_triton(logits, **params, chunk=512), first)
    # a row's token depends on its own (logits, parameters, seed, step), not on the rest of the batch
    perm = torch.tensor([3, 7, 0, 5, 1, 6, 2, 4])
    shuffled = sample_triton(logits[perm], **{k: v[perm] for k, v in params.items()}, chunk=512)
    assert torch.equal(shuffled, first[perm])
    alone = sample_triton(logits[2:3], **{k: v[2:3] for k, v in params.items()}, chunk=512)
    assert alone.item() == first[2].item()
    # the next step draws new numbers
    params["temperature"].fill_(1.0)
    a = sample_triton(logits, **params, chunk=512)
    params["steps"] += 1
    assert not torch.equal(sample_triton(logits, **params, chunk=512), a)


def test_exponential_race_distribution():
    """sample_ref's race draws from filtered_probs_ref: chi-square over 40000 draws (the hash makes it
    deterministic, the bound is the 1e-6 tail for 9 degrees of freedom)."""
    V, N = 10, 40_000
    logits = torch.linspace(2.0, -1.0, V)[torch.randperm(V, generator=torch.Generator().manual_seed(0))]
    rows = logits.expand(N, V)
    params = dict(temperature=torch.full((N,), 0.8), top_k=torch.full((N,), 8), top_p=torch.full((N,), 0.9),
                  min_p=torch.full((N,), 0.05), seeds=torch.full((N,), 1234), steps=torch.arange(N))
    probs = filtered_probs_ref(rows[:1], params["temperature"][:1], params["top_k"][:1], params["top_p"][:1],
                               params["min_p"][:1])[0]
    counts = torch.bincount(sample_ref(rows, **params), minlength=V).double()
    kept = probs > 0
    assert 2 <= kept.sum() < V and counts[~kept].sum() == 0
    expected = N * probs[kept].double()
    chi2 = ((counts[kept] - expected) ** 2 / expected).sum().item()
    assert chi2 < 46.0, chi2


def test_uniforms_stay_inside_the_unit_interval():
    """Over the full vocabulary u < 1 always (u = 1 makes E = 0: the race then ignores the probabilities). The first
    seed is one whose 24-bit uniforms hit 1.0; top_k = 1 must then still give the argmax."""
    V = 248_320
    seeds = torch.tensor([-2568521157030188392] + list(range(-2**40, -2**40 + 63 * 7919, 7919)))
    steps = torch.tensor([9763] + list(range(63)))
    u = random_uniform_ref(seeds, steps, V)
    assert u.min() > 0 and u.max() < 1
    logits = torch.randn(64, V, generator=torch.Generator().manual_seed(1)) * 3
    ones = torch.ones(64)
    assert torch.equal(sample_ref(logits, ones, ones.long(), ones, 0 * ones, seeds, steps), logits.argmax(-1))


@triton.jit
def _log_kernel(x, y, n, B: tl.constexpr):
    o = tl.program_id(0) * B + tl.arange(0, B)
    tl.store(y + o, _log(tl.load(x + o, mask=o < n, other=1.0)), mask=o < n)


def test_log_helper_within_a_few_ulp():
    """The sampler's own log, over every 997th 23-bit uniform, both ends, and values around sqrt(2)."""
    m = torch.arange(0, 1 << 23, 997, dtype=torch.float64)
    x = torch.cat([((m + 0.5) / 2 ** 23).float(), torch.tensor([0.5 / 2 ** 23, 1 - 0.5 / 2 ** 23, 1.0, 1.41421,
                                                                  1.41422, 0.7071, 17.0, 1e-30, 3e38])])
    y = torch.empty_like(x)
    _log_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), B=1024)
    exact = torch.log(x.double())
    ulp = (exact.abs() * 2.0 ** -23).clamp_min(2.0 ** -149)
    assert ((y.double() - exact).abs() / ulp).max() < 4


@pytest.mark.parametrize("n", [0, 1, 5, 20])
def test_token_logprobs(n):
    g = torch.Generator().manual_seed(n)
    logits = torch.randn(5, 1500, generator=g) * 3
    logits[1, 100:] = float("-inf")
    tokens = torch.randint(0, 100, (5,), generator=g)
    lp, values, ids = token_logprobs_triton(logits, tokens, n, chunk=256)
    ref_all, ref_values, ref_ids = top_logprobs_ref(logits, n)
    torch.testing.assert_close(lp, ref_all.gather(1, tokens[:, None])[:, 0], rtol=0, atol=1e-5)
    torch.testing.assert_close(values, ref_values, rtol=0, atol=1e-5)
    assert torch.equal(ids, ref_ids)
    cpu = token_logprobs(logits, tokens, n)
    assert torch.equal(cpu[2], ref_ids) and torch.equal(cpu[1], ref_values)


# ---------------------------------------------------------------------------------------------------- GPU

VOCAB = 248_320


@pytest.mark.gpu
@pytest.mark.parametrize("mix", list(MIXES))
def test_sample_gpu(mix):
    for seed in range(4):
        logits, params = batch(16, VOCAB, mix, "cuda", scale=3.0, seed=seed)
        assert torch.equal(sample(logits, **params), reference(logits, params))


@pytest.mark.gpu
def test_sample_penalties_gpu():
    logits, params = batch(8, VOCAB, "mixed", "cuda", seed=7)
    pen = penalties_for(logits)
    assert torch.equal(sample(logits, **params, penalties=pen), reference(logits, params, pen))


@pytest.mark.gpu
def test_sample_ties_gpu():
    """bf16-valued logits, as the lm_head produces them: many exact ties."""
    logits, params = batch(16, VOCAB, "mixed", "cuda", scale=3.0, seed=8)
    logits = logits.bfloat16().float()
    assert torch.equal(sample(logits, **params), reference(logits, params))


@pytest.mark.gpu
def test_sample_graph_replay():
    logits, params = batch(8, VOCAB, "mixed", "cuda", seed=9)
    pen = penalties_for(logits)
    sample(logits, **params, penalties=pen)          # compile outside the capture
    lp_tokens = torch.zeros(8, dtype=torch.int64, device="cuda")
    token_logprobs(logits, lp_tokens, 20)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tokens = sample(logits, **params, penalties=pen)
        lp = token_logprobs(logits, tokens, 20)
    new_logits, new_params = batch(8, VOCAB, "mixed", "cuda", seed=10)
    logits.copy_(new_logits)
    for k, v in new_params.items():
        params[k].copy_(v)
    graph.replay()
    torch.cuda.synchronize()
    want = sample(logits, **params, penalties=pen)
    assert torch.equal(tokens, want)
    for got, ref in zip(lp, token_logprobs(logits, want, 20)):
        assert torch.equal(got, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 8])
def test_token_logprobs_gpu(B):
    logits = torch.randn(B, VOCAB, device="cuda") * 3
    tokens = torch.randint(0, VOCAB, (B,), device="cuda")
    lp, values, ids = token_logprobs(logits, tokens, 20)
    ref_all, ref_values, ref_ids = top_logprobs_ref(logits, 20)
    torch.testing.assert_close(lp, ref_all.gather(1, tokens[:, None])[:, 0], rtol=0, atol=1e-4)
    torch.testing.assert_close(values, ref_values, rtol=0, atol=1e-4)
    assert torch.equal(ids, ref_ids)


def random_mask(B, V, seed=0):
    g = torch.Generator().manual_seed(seed)
    words = torch.randint(-2 ** 31, 2 ** 31, (B, -(-V // 32)), generator=g, dtype=torch.int64)
    return words.to(torch.int32)


@pytest.mark.parametrize("V", [64, 1000, 4133])
def test_token_mask(V):
    logits, mask = torch.randn(3, V), random_mask(3, V, seed=V)
    want = token_mask_ref(logits, mask)
    for b in range(3):          # bit t % 32 of word t // 32, one token at a time
        for t in range(0, V, 7):
            allowed = (int(mask[b, t // 32]) >> (t % 32)) & 1
            assert want[b, t].item() == (logits[b, t].item() if allowed else float("-inf"))
    assert torch.equal(token_mask_triton(logits, mask, block=256), want)


@pytest.mark.gpu
def test_token_mask_gpu():
    logits, mask = torch.randn(8, 248320, device="cuda"), random_mask(8, 248320).cuda()
    assert torch.equal(token_mask(logits, mask).cpu(), token_mask_ref(logits.cpu(), mask.cpu()))
