"""Speculative acceptance: greedy keeps the longest prefix equal to the target's argmax; rejection sampling keeps tokens
distributed exactly as the target's (chi-square over many seeds, with temperature / top-k / top-p and a bad draft)."""

import pytest
import torch

from engine.core.sampling import Sampling
from engine.spec.acceptance import accept, draft_probs, pick_draft
from qwendesk_kernels.sampling import filtered_probs_ref

V, K = 6, 2


def sampling(n, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed0=0, seeded=False):
    return Sampling(torch.full((n,), temperature), torch.full((n,), top_k), torch.full((n,), top_p),
                    torch.full((n,), min_p), torch.arange(seed0, seed0 + n), torch.full((n,), 7),
                    torch.full((n,), seeded))


def test_greedy_keeps_the_matching_prefix_and_the_next_target():
    logits = torch.full((3, K + 1, V), -5.0)
    targets = torch.tensor([[1, 2, 3], [1, 4, 0], [5, 5, 5]])
    logits.scatter_(2, targets[..., None], 5.0)
    drafts = torch.tensor([[1, 2], [1, 2], [0, 5]])
    kept, tokens = accept(drafts, logits, sampling(3, temperature=0.0), None)
    assert kept.tolist() == [2, 1, 0]
    assert [tokens[i, :kept[i] + 1].tolist() for i in range(3)] == [[1, 2, 3], [1, 4], [5]]


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    n = counts.sum()
    expected = probs * n
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a token of probability 0 was drawn"
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


@pytest.mark.parametrize("params, bad_draft", [(dict(), False), (dict(temperature=0.7, top_k=4), False),
                                               (dict(temperature=1.3, top_p=0.8), False), (dict(), True)])
def test_rejection_sampling_keeps_the_target_distribution(params, bad_draft):
    """Rows of fixed logits (the target at position j does not depend on the tokens before it here), N seeds: the
    first new token follows p_0, the second (when kept) p_1, whatever the draft distribution."""
    torch.manual_seed(0)
    N = 40000
    target = torch.randn(K + 1, V) * 1.5
    draft = target[:K, :V - 2] + torch.randn(K, V - 2)    # a noisy draft over the first V - 2 tokens
    if bad_draft:
        draft = -target[:K, :V - 2]               # the draft prefers what the target avoids
    s = sampling(N, **params)
    q_steps, drafts = [], []
    for j in range(K):
        token, q = pick_draft(draft[j].expand(N, -1), s, j + 1, True)
        drafts.append(token)
        q_steps.append(q)
    kept, tokens = accept(torch.stack(drafts, 1), target.expand(N, -1, -1), s, torch.stack(q_steps, 1))
    p = filtered_probs_ref(target, s.temperature[:K + 1], s.top_k[:K + 1], s.top_p[:K + 1], s.min_p[:K + 1])
    first = torch.bincount(tokens[:, 0], minlength=V).float()
    assert chi_square(first, p[0]) < 25.0              # 5 degrees of freedom: p(chi2 > 25) < 1e-4
    second = torch.bincount(tokens[kept >= 1, 1], minlength=V).float()
    assert second.sum() > 1000 and chi_square(second, p[1]) < 25.0
    q0 = draft_probs(draft[0].expand(1, -1), s.rows(torch.tensor([0])))[0]
    expected_keep = torch.minimum(p[0, :V - 2], q0).sum()          # P(first draft kept) = sum min(p, q)
    assert abs((kept >= 1).float().mean() - expected_keep) < 0.01


def test_seeded_rounds_reproduce():
    target = torch.randn(4, K + 1, V)
    draft = torch.randn(4, V)
    s = sampling(4, temperature=0.9, seed0=123)
    runs = []
    for _ in range(2):
        token, q = pick_draft(draft, s, 1, True)
        runs.append(accept(torch.stack([token, token], 1), target, s, torch.stack([q, q], 1)))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])


def test_seeded_rows_keep_what_plain_seeded_sampling_draws():
    """Whatever the drafts, a seeded row's new tokens are the ones plain decoding draws at those steps."""
    from qwendesk_kernels.sampling import sample_ref
    torch.manual_seed(3)
    n = 64
    target = torch.randn(n, K + 1, V)
    s = sampling(n, temperature=0.8, top_p=0.9, seeded=True)
    drafts = torch.randint(0, V, (n, K))
    q = torch.softmax(torch.randn(n, K, V - 2), -1)
    kept, tokens = accept(drafts, target, s, q)
    for j in range(K + 1):
        plain = sample_ref(target[:, j], s.temperature, s.top_k, s.top_p, s.min_p, s.seeds, s.steps + j)
        upto = kept >= j
        assert torch.equal(tokens[upto, j], plain[upto])
