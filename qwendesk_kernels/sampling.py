"""Sampling over the vocabulary, batched, with per-request parameters.

Randomness is counter-based: the uniform for (request seed, step, token) comes from a 32-bit
integer hash, so a seeded request reproduces whatever else is in the batch, and the Triton
kernel and this reference draw the same numbers. A token is drawn by the exponential race
(argmax p_i / E_i with E_i = -log u_i), which samples exactly from p.

Order (as vLLM / OpenAI servers do it): penalties on the raw logits, then temperature, then
top-k, top-p and min-p filtering of the tempered distribution. temperature == 0 means greedy.

The Triton step draws exactly the token sample_ref draws, without sorting the vocabulary:

1. Rank a row's tokens by tempered logit x = l / t, higher first, the lower id first among equal
   logits: the order of sample_ref's stable descending sort. Each filter keeps a prefix of this
   order (top-k: rank < k; top-p: mass ranked strictly above < top_p; min-p: p >= min_p * p_max;
   rank 0 always), so together they keep a prefix. The race picks the kept token with the largest
   key s = x - log E = log(p / E) + a row constant (the lower id on a tie).
2. Call a token a record when no token ranked above it has a larger key. The winner is a record:
   a token ranked above a kept token is kept too, so a record that dominates the winner would win.
   Walk the records from the largest key: the next record is the largest key among the tokens ranked
   above the last one. The winner is the first record the filters keep, because while a record is
   dropped, so is everything ranked below it.
3. Records are few: the i-th ranked token is one with probability at most 1/i (the E_i are i.i.d. and
   every token ranked above it has a logit at least as large), about ln n of n tokens: 9 per 4096-token
   chunk and 13 per row of 248K on average for a flat distribution, fewer for a peaked one.
4. So: per chunk, find the chunk's records (the row's records are records of their chunks); per row,
   the row's records among those ("pivots"); per chunk, count the tokens and the probability mass
   ranked above each pivot; per row, apply top-k / top-p / min-p to the pivots and take the kept pivot
   with the largest key. Every test is the one sample_ref makes, on the same quantity.
5. Caps bound the work (CAP records per chunk, GCAP pivots per row). The row list is cut at its
   smallest keys, so a kept pivot among those stored is still the winner. A chunk list cut short
   leaves out records with keys at most its first left-out key (its "floor"); when the chosen key is
   not above every floor, or nothing stored is kept, the row finishes with the walk of step 2 over the
   whole row (one pass per record, no caps). With 32 per chunk that happens for fewer than 1e-9 rows.

The two can differ only where float rounding differs: sums, exp and log computed in another order
moving a mass, probability or key across a decision boundary by an ulp (exact ties aside), and
top_p >= 1 is taken as "off" (sample_ref's rounded cumulative sum can still drop tail tokens holding
~1e-7 of the mass).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

MASK32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (lowbias32) on int64 tensors holding uint32 values."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & MASK32
    return x ^ (x >> 16)


def random_uniform_ref(seeds: torch.Tensor, steps: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B] seeds, [B] steps -> [B, vocab] uniforms in (0, 1), a pure function of (seed, step, index).
    23 bits: (m + 0.5) / 2^23 is exact in fp32 and below 1 (with 24 bits the top value rounds to 1.0, so E = 0
    and the race of ~1.5% of rows over 248K tokens went to a token of any probability, or to NaN)."""
    seeds = seeds.long()
    key = _mix32((_mix32((seeds ^ (seeds >> 32)) & MASK32) ^ (steps.long() * 0x9E3779B9)) & MASK32)
    idx = torch.arange(vocab, device=seeds.device, dtype=torch.int64)
    bits = _mix32((idx[None, :] + key[:, None] * 0x632BE5AB) & MASK32)
    return ((bits >> 9).float() + 0.5) * (1.0 / (1 << 23))


def apply_penalties_ref(logits, output_counts, prompt_mask, presence, frequency, repetition):
    """In place on fp32 logits [B, V]. output_counts [B, V]: times each token was generated;
    prompt_mask [B, V]: token occurs in the prompt. Repetition divides positive / multiplies
    negative logits of every token seen in prompt or output (CTRL / HF style); presence and
    frequency subtract from generated tokens (OpenAI style)."""
    seen = (output_counts > 0) | prompt_mask
    rep = repetition[:, None].expand_as(logits)
    penalised = torch.where(logits > 0, logits / rep, logits * rep)
    logits.copy_(torch.where(seen, penalised, logits))
    logits -= frequency[:, None] * output_counts + presence[:, None] * (output_counts > 0)
    return logits


def filtered_probs_ref(logits, temperature, top_k, top_p, min_p):
    """Tempered, filtered, renormalised probabilities [B, V] (rows with temperature 0 unused)."""
    t = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    probs = torch.softmax(logits / t[:, None], dim=-1)
    sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)   # equal p: lower id first
    rank = torch.arange(probs.shape[-1], device=probs.device)[None, :]
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, probs.shape[-1]))
    drop = rank >= k[:, None]
    before = sorted_p.cumsum(-1) - sorted_p                      # mass strictly above this token
    drop |= before >= top_p[:, None]
    drop |= sorted_p < min_p[:, None] * sorted_p[:, :1]
    drop[:, 0] = False                                           # the most likely token always stays
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    return probs / probs.sum(-1, keepdim=True)


def race_ref(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """The exponential race: argmax p_i / E_i with E_i = -log u_i draws token i with probability p_i."""
    return (probs / -torch.log(uniforms)).argmax(-1)


def sample_ref(logits, temperature, top_k, top_p, min_p, seeds, steps):
    """logits [B, V] fp32 (penalties already applied) -> token ids [B] int64."""
    greedy = logits.argmax(-1)
    probs = filtered_probs_ref(logits, temperature, top_k, top_p, min_p)
    sampled = race_ref(probs, random_uniform_ref(seeds, steps, logits.shape[-1]))
    return torch.where(temperature > 0, sampled, greedy)


def top_logprobs_ref(logits, n: int):
    """Log-softmax of the model's raw logits: (logprobs [B, V], top-n values [B, n], top-n ids [B, n])."""
    logprobs = torch.log_softmax(logits, dim=-1)
    values, ids = logprobs.topk(n, dim=-1) if n > 0 else (logprobs[:, :0], logprobs[:, :0].long())
    return logprobs, values, ids


# ---------------------------------------------------------------------------------------------------
# Triton sampling: scan (per chunk: penalties, temperature, softmax partials, first argmax, race keys,
# the chunk's records) -> merge (per row: max, normaliser, argmax, pivots) -> count (per chunk, rows with
# top-k or top-p: tokens and mass ranked above each pivot) -> select (per row: filters, winner, the walk
# when a cut list could hide it). Fixed grids, no host syncs: the whole step is graph-capturable.

NONE = tl.constexpr(2147483647)                 # "no token"
LOWEST = tl.constexpr(-9223372036854775808)     # below every _rank_key
NEG_INF = tl.constexpr(float("-inf"))


class Penalties(NamedTuple):
    """Dense per-row penalty state, as apply_penalties_ref takes it."""
    output_counts: torch.Tensor   # [B, V] int or float: times each token was generated
    prompt_mask: torch.Tensor     # [B, V] bool: token occurs in the prompt
    presence: torch.Tensor        # [B] fp32
    frequency: torch.Tensor       # [B] fp32
    repetition: torch.Tensor      # [B] fp32


@triton.jit
def _hash32(x):
    """lowbias32 on uint32 (wrapping multiplies), as _mix32 above."""
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


@triton.jit
def _row_key(seeds_ptr, steps_ptr, row):
    seed = tl.load(seeds_ptr + row).to(tl.int64)
    step = tl.load(steps_ptr + row).to(tl.int64)
    return _hash32(_hash32((seed ^ (seed >> 32)).to(tl.uint32)) ^ (step.to(tl.uint32) * 0x9E3779B9))


@triton.jit
def _log(x):
    """Natural log of positive normal fp32, within ~3 ulp (measured in the interpreter). Written out because
    tl.log promises no accuracy and a fast log2 with ~2^-22 absolute error would swamp log(u) for u near 1:
    exactly the small E = -log(u) that win races, so the kernel could disagree with sample_ref there.
    x = 2^e f with f in [sqrt(1/2), sqrt(2)); log f = 2 atanh(s), s = (f - 1) / (f + 1), |s| < 0.172."""
    bits = x.to(tl.int32, bitcast=True)
    big = (bits & 0x7FFFFF) > 0x3504F3                       # mantissa above sqrt(2): take f / 2
    e = (bits >> 23) - 127 + big.to(tl.int32)
    f = ((bits & 0x7FFFFF) | tl.where(big, 0x3F000000, 0x3F800000)).to(tl.float32, bitcast=True)
    s = tl.math.div_rn(f - 1.0, f + 1.0)
    s2 = s * s
    series = 1.0 + s2 * (1.0 / 3 + s2 * (1.0 / 5 + s2 * (1.0 / 7 + s2 * (1.0 / 9 + s2 * (1.0 / 11)))))
    return e.to(tl.float32) * 0.6931471805599453 + 2.0 * s * series


@triton.jit
def _race_key(x, idx, key):
    """log(p / E) up to a per-row constant, with E = -log(u) from the same uniform as random_uniform_ref."""
    bits = _hash32(idx.to(tl.uint32) + key * 0x632BE5AB)
    u = ((bits >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608)
    return x - _log(-_log(u))


@triton.jit
def _tempered(logits_ptr, counts_ptr, prompt_ptr, pres_ptr, freq_ptr, rep_ptr, row, offs, mask, temp,
              stride_l, stride_c, stride_p, PENALTIES: tl.constexpr):
    """Penalised logits / temperature (fp32, -inf outside the row), as apply_penalties_ref then sample_ref."""
    l = tl.load(logits_ptr + row * stride_l + offs, mask=mask, other=NEG_INF).to(tl.float32)
    if PENALTIES:
        presence = tl.load(pres_ptr + row)
        frequency = tl.load(freq_ptr + row)
        repetition = tl.load(rep_ptr + row)
        on = tl.where((presence != 0) | (frequency != 0) | (repetition != 1), mask, False)   # plain rows: no loads
        c = tl.load(counts_ptr + row * stride_c + offs, mask=on, other=0).to(tl.float32)
        seen = (c > 0) | (tl.load(prompt_ptr + row * stride_p + offs, mask=on, other=0) != 0)
        l = tl.where(seen, tl.where(l > 0, tl.math.div_rn(l, repetition), l * repetition), l)
        l = l - (frequency * c + presence * (c > 0).to(tl.float32))
    return tl.math.div_rn(l, temp)


@triton.jit
def _row_temp(temp_ptr, row):
    """The row's temperature, 1 for greedy rows (their tempered logits are then the logits)."""
    t = tl.load(temp_ptr + row).to(tl.float32)
    return tl.where(t > 0, t, 1.0)


@triton.jit
def _rank_key(v, idx):
    """int64 keys that order larger v first, then the lower index (v's float order bits in the high half,
    -0.0 read as +0.0; the complemented index in the low half): a max over keys is an argmax."""
    b = (v + 0.0).to(tl.int32, bitcast=True)
    return ((b ^ ((b >> 31) & 0x7FFFFFFF)).to(tl.int64) << 32) | (idx ^ 0x7FFFFFFF).to(tl.int64)


@triton.jit
def _unrank(key):
    """(v, idx) of a _rank_key; LOWEST gives idx NONE."""
    hi = (key >> 32).to(tl.int32)
    return (hi ^ ((hi >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True), (key & 0x7FFFFFFF).to(tl.int32) ^ 0x7FFFFFFF


@triton.jit
def _records(s, x, idx, valid, out_x, out_s, out_i, CAP: tl.constexpr):
    """Store the race records of the valid lanes, largest key first, at most CAP of them.
    Returns (count, floor): floor is the key of the first record left out, -inf when none is."""
    s_key = tl.where(valid, _rank_key(s, idx), LOWEST)
    r_key = _rank_key(x, idx)
    bound = tl.full((), LOWEST, tl.int64)                  # rank key of the last record: none yet
    n = tl.zeros((), tl.int32)
    floor = tl.full((), NEG_INF, tl.float32)
    go = n == 0
    while go:
        best = tl.max(tl.where(r_key > bound, s_key, LOWEST), axis=0)   # largest key ranked above the last
        ki = (best & 0x7FFFFFFF).to(tl.int32) ^ 0x7FFFFFFF
        bound = tl.max(tl.where(idx == ki, r_key, LOWEST), axis=0)
        hs = (best >> 32).to(tl.int32)                                   # _unrank, inlined in this hot loop
        hx = (bound >> 32).to(tl.int32)
        ks = (hs ^ ((hs >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
        kx = (hx ^ ((hx >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
        found = best != LOWEST
        keep = found & (n < CAP)
        tl.store(out_x + n, kx, mask=keep)
        tl.store(out_s + n, ks, mask=keep)
        tl.store(out_i + n, ki, mask=keep)
        floor = tl.where(found & (n == CAP), ks, floor)
        n += keep.to(tl.int32)
        go = keep
    return n, floor


@triton.jit
def _scan_kernel(logits_ptr, counts_ptr, prompt_ptr, pres_ptr, freq_ptr, rep_ptr, temp_ptr, seeds_ptr, steps_ptr,
                 chunk_f, chunk_i, V, stride_l, stride_c, stride_p,
                 CHUNK: tl.constexpr, CAP: tl.constexpr, PENALTIES: tl.constexpr):
    """chunk_f [B, chunks, 3 + 2 CAP]: max, sum exp(x - max), floor, record x [CAP], record keys [CAP];
    chunk_i [B, chunks, 2 + CAP]: first argmax, record count, record ids [CAP]."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = offs < V
    x = _tempered(logits_ptr, counts_ptr, prompt_ptr, pres_ptr, freq_ptr, rep_ptr, row, offs, mask,
                  _row_temp(temp_ptr, row), stride_l, stride_c, stride_p, PENALTIES)
    m = tl.max(x, axis=0)
    total = tl.sum(tl.where(x > NEG_INF, tl.exp(x - m), 0.0), axis=0)
    arg = tl.argmax(x, axis=0, tie_break_left=True)
    slot = row * tl.num_programs(1) + chunk
    f = chunk_f + slot * (3 + 2 * CAP)
    i = chunk_i + slot * (2 + CAP)
    n = tl.zeros((), tl.int32)
    floor = tl.full((), NEG_INF, tl.float32)
    if tl.load(temp_ptr + row) > 0:                          # greedy rows run no race
        s = _race_key(x, offs, _row_key(seeds_ptr, steps_ptr, row))
        n, floor = _records(s, x, offs, mask, f + 3, f + 3 + CAP, i + 2, CAP)
    tl.store(f, m)
    tl.store(f + 1, total)
    tl.store(f + 2, floor)
    tl.store(i, chunk * CHUNK + arg)
    tl.store(i + 1, n)


@triton.jit
def _merge_kernel(chunk_f, chunk_i, row_f, row_i, NCHUNK,
                  NC_BLOCK: tl.constexpr, CAP: tl.constexpr, GCAP: tl.constexpr, CAND: tl.constexpr):
    """row_f [B, 3 + 2 GCAP]: max, normaliser, floor, pivot x [GCAP], pivot keys [GCAP];
    row_i [B, 2 + GCAP]: argmax (greedy token, rank 0), pivot count, pivot ids [GCAP]."""
    row = tl.program_id(0)
    c = tl.arange(0, NC_BLOCK)
    cm = c < NCHUNK
    cf = chunk_f + (row * NCHUNK + c) * (3 + 2 * CAP)
    cmax = tl.load(cf, mask=cm, other=NEG_INF)
    m = tl.max(cmax, axis=0)
    total = tl.sum(tl.where(cmax > NEG_INF, tl.load(cf + 1, mask=cm, other=0.0) * tl.exp(cmax - m), 0.0), axis=0)
    best = tl.argmax(cmax, axis=0, tie_break_left=True)
    greedy = tl.load(chunk_i + (row * NCHUNK + best) * (2 + CAP))
    floor = tl.max(tl.load(cf + 2, mask=cm, other=NEG_INF), axis=0)
    # the chunks' records, flattened: candidate k is record k % CAP of chunk k // CAP
    k = tl.arange(0, CAND)
    kc = k // CAP
    kj = k % CAP
    ki = chunk_i + (row * NCHUNK + kc) * (2 + CAP)
    valid = (kc < NCHUNK) & (kj < tl.load(ki + 1, mask=kc < NCHUNK, other=0))
    kf = chunk_f + (row * NCHUNK + kc) * (3 + 2 * CAP) + 3 + kj
    x = tl.load(kf, mask=valid, other=NEG_INF)
    s = tl.load(kf + CAP, mask=valid, other=NEG_INF)
    idx = tl.load(ki + 2 + kj, mask=valid, other=NONE)
    rf = row_f + row * (3 + 2 * GCAP)
    ri = row_i + row * (2 + GCAP)
    n, _ = _records(s, x, idx, valid, rf + 3, rf + 3 + GCAP, ri + 2, GCAP)   # cut at the smallest keys: harmless
    tl.store(rf, m)
    tl.store(rf + 1, total)
    tl.store(rf + 2, floor)
    tl.store(ri, greedy)
    tl.store(ri + 1, n)


@triton.jit
def _filters_on(temp_ptr, topk_ptr, topp_ptr, row, V):
    """(top-k on, top-p on) for a sampled row; both off for greedy rows."""
    sampled = tl.load(temp_ptr + row) > 0
    k = tl.load(topk_ptr + row)
    return sampled & (k > 0) & (k < V), sampled & (tl.load(topp_ptr + row) < 1.0)


@triton.jit
def _count_kernel(logits_ptr, counts_ptr, prompt_ptr, pres_ptr, freq_ptr, rep_ptr, temp_ptr, topk_ptr, topp_ptr,
                  row_f, row_i, partial, V, stride_l, stride_c, stride_p,
                  CHUNK: tl.constexpr, SUB: tl.constexpr, GCAP: tl.constexpr, PB: tl.constexpr,
                  PENALTIES: tl.constexpr):
    """partial [B, chunks, 2, GCAP]: per pivot, the number and the mass (sum exp(x - max)) of this chunk's
    tokens ranked above it. Only rows with top-k or top-p need it."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    use_k, use_p = _filters_on(temp_ptr, topk_ptr, topp_ptr, row, V)
    if use_k | use_p:
        temp = _row_temp(temp_ptr, row)
        rf = row_f + row * (3 + 2 * GCAP)
        ri = row_i + row * (2 + GCAP)
        m = tl.load(rf)
        n = tl.load(ri + 1)
        out = partial + (row * tl.num_programs(1) + chunk) * 2 * GCAP
        for g in range(0, n, PB):
            j = g + tl.arange(0, PB)
            jm = j < n
            pivot = _rank_key(tl.load(rf + 3 + j, mask=jm, other=0.0), tl.load(ri + 2 + j, mask=jm, other=0))
            count = tl.zeros([PB], tl.float32)
            mass = tl.zeros([PB], tl.float32)
            for sub in range(0, CHUNK, SUB):
                offs = chunk * CHUNK + sub + tl.arange(0, SUB)
                mask = offs < V
                x = _tempered(logits_ptr, counts_ptr, prompt_ptr, pres_ptr, freq_ptr, rep_ptr, row, offs, mask, temp,
                              stride_l, stride_c, stride_p, PENALTIES)
                e = tl.where(x > NEG_INF, tl.exp(x - m), 0.0)
                above = mask[:, None] & (_rank_key(x, offs)[:, None] > pivot[None, :])
                count += tl.sum(above.to(tl.float32), axis=0)
                mass += tl.sum(tl.where(above, e[:, None], 0.0), axis=0)
            tl.store(out + j, count, mask=jm)
            tl.store(out + GCAP + j, mass, mask=jm)


@triton.jit
def _kept(x, idx, count, mass, m, total, greedy, k, top_p, min_p, use_k, use_p):
    """sample_ref's filters for tokens with these logits / ids and counts / masses ranked above them."""
    p = tl.math.div_rn(tl.exp(x - m), total)
    keep = ~(p < min_p * tl.math.div_rn(1.0, total))
    keep &= tl.where(use_k, count < k, True)
    keep &= tl.where(use_p, tl.math.div_rn(mass, total) < top_p, True)
    return keep | (idx == greedy)


@triton.jit
def _walk(logits_ptr, counts_ptr, prompt_ptr, pres_ptr, freq_ptr, rep_ptr, row, temp, key, V,
          stride_l, stride_c, stride_p, m, total, greedy, k, top_p, min_p, use_k, use_p, bound,
          TILE: tl.constexpr, PENALTIES: tl.constexpr):
    """The record walk over the whole row, from the rank key of a dropped token (LOWEST: from nothing).
    Exact, no caps: one pass to find the next record, one to count what ranks above it. The bound rises
    every step, so it ends (on rank 0, which is kept) even on NaN logits."""
    token = greedy
    go = tl.full((), True, tl.int1)
    while go:
        best = tl.full((), LOWEST, tl.int64)
        for start in range(0, V, TILE):
            offs = start + tl.arange(0, TILE)
            mask = offs < V
            x = _tempered(logits_ptr, counts_ptr, prompt_ptr, pres_ptr, freq_ptr, rep_ptr, row, offs, mask, temp,
                          stride_l, stride_c, stride_p, PENALTIES)
            above = mask & (_rank_key(x, offs) > bound)
            best = tl.maximum(best, tl.max(tl.where(above, _rank_key(_race_key(x, offs, key), offs), LOWEST), axis=0))
        _, cand = _unrank(best)
        x = _tempered(logits_ptr, counts_ptr, prompt_ptr, pres_ptr, freq_ptr, rep_ptr, row, cand, cand < V, temp,
                      stride_l, stride_c, stride_p, PENALTIES)
        bound = _rank_key(x, cand)
        count = tl.zeros((), tl.float32)
        mass = tl.zeros((), tl.float32)
        for start in range(0, V, TILE):
            offs = start + tl.arange(0, TILE)
            mask = offs < V
            xs = _tempered(logits_ptr, counts_ptr, prompt_ptr, pres_ptr, freq_ptr, rep_ptr, row, offs, mask, temp,
                           stride_l, stride_c, stride_p, PENALTIES)
            above = mask & (_rank_key(xs, offs) > bound)
            count += tl.sum(above.to(tl.float32), axis=0)
            mass += tl.sum(tl.where(above & (xs > NEG_INF), tl.exp(xs - m), 0.0), axis=0)
        found = best != LOWEST
        token = tl.where(found, cand, token)
        go = found & ~_kept(x, cand, count, mass, m, total, greedy, k, top_p, min_p, use_k, use_p)
    return token


@triton.jit
def _select_kernel(logits_ptr, counts_ptr, prompt_ptr, pres_ptr, freq_ptr, rep_ptr, temp_ptr, topk_ptr, topp_ptr,
                   minp_ptr, seeds_ptr, steps_ptr, row_f, row_i, partial, out_ptr, V, NCHUNK,
                   stride_l, stride_c, stride_p,
                   NC_BLOCK: tl.constexpr, GCAP: tl.constexpr, TILE: tl.constexpr, PENALTIES: tl.constexpr):
    row = tl.program_id(0)
    rf = row_f + row * (3 + 2 * GCAP)
    ri = row_i + row * (2 + GCAP)
    token = tl.load(ri)                                          # greedy: the first argmax
    if tl.load(temp_ptr + row) > 0:
        use_k, use_p = _filters_on(temp_ptr, topk_ptr, topp_ptr, row, V)
        m = tl.load(rf)
        total = tl.load(rf + 1)
        k = tl.load(topk_ptr + row)
        top_p = tl.load(topp_ptr + row)
        min_p = tl.load(minp_ptr + row)
        n = tl.load(ri + 1)
        j = tl.arange(0, GCAP)
        jm = j < n
        px = tl.load(rf + 3 + j, mask=jm, other=0.0)
        ps = tl.load(rf + 3 + GCAP + j, mask=jm, other=NEG_INF)
        pi = tl.load(ri + 2 + j, mask=jm, other=NONE)
        c = tl.arange(0, NC_BLOCK)[:, None]
        parts = partial + ((row * NCHUNK + c) * 2) * GCAP + j[None, :]
        pmask = (c < NCHUNK) & jm[None, :]                     # (not written, and not used, without top-k/p)
        count = tl.sum(tl.load(parts, mask=pmask, other=0.0), axis=0)
        mass = tl.sum(tl.load(parts + GCAP, mask=pmask, other=0.0), axis=0)
        kept = jm & _kept(px, pi, count, mass, m, total, token, k, top_p, min_p, use_k, use_p)
        ks, ki = _unrank(tl.max(tl.where(kept, _rank_key(ps, pi), LOWEST), axis=0))
        if (ki == NONE) | (ks <= tl.load(rf + 2)):
            # a record a cut chunk list left out could win: walk from the best ranked dropped pivot
            dropped = tl.max(tl.where(jm & ~kept, _rank_key(px, pi), LOWEST), axis=0)
            ki = _walk(logits_ptr, counts_ptr, prompt_ptr, pres_ptr, freq_ptr, rep_ptr, row, _row_temp(temp_ptr, row),
                       _row_key(seeds_ptr, steps_ptr, row), V, stride_l, stride_c, stride_p, m, total, token, k,
                       top_p, min_p, use_k, use_p, dropped, TILE, PENALTIES)
        token = ki
    tl.store(out_ptr + row, token.to(tl.int64))


def sample_triton(logits, temperature, top_k, top_p, min_p, seeds, steps, penalties: Penalties | None = None,
                  chunk: int = 4096, cap: int = 32, global_cap: int = 64):
    """The Triton sampling step (module docstring). logits [B, V] fp32, raw (penalties are applied inside);
    per-row parameters: contiguous [B] tensors on the logits' device (temperature, top_p, min_p and the
    penalty weights fp32; top_k, seeds, steps int). chunk / cap / global_cap: chunk length and record caps
    (powers of two; the defaults suit V ~ 250K, tests shrink them)."""
    B, V = logits.shape
    assert logits.stride(1) == 1
    dev = logits.device
    nchunk = triton.cdiv(V, chunk)
    nc_block = triton.next_power_of_2(nchunk)
    chunk_f = torch.empty(B, nchunk, 3 + 2 * cap, dtype=torch.float32, device=dev)
    chunk_i = torch.empty(B, nchunk, 2 + cap, dtype=torch.int32, device=dev)
    row_f = torch.empty(B, 3 + 2 * global_cap, dtype=torch.float32, device=dev)
    row_i = torch.empty(B, 2 + global_cap, dtype=torch.int32, device=dev)
    partial = torch.empty(B, nchunk, 2, global_cap, dtype=torch.float32, device=dev)
    out = torch.empty(B, dtype=torch.int64, device=dev)
    if penalties is None:
        pen, strides = (logits,) * 5, (0, 0)
    else:
        pen = (penalties.output_counts.contiguous(), penalties.prompt_mask.contiguous(), penalties.presence,
               penalties.frequency, penalties.repetition)
        strides = (pen[0].stride(0), pen[1].stride(0))
    on = penalties is not None
    _scan_kernel[(B, nchunk)](logits, *pen, temperature, seeds, steps, chunk_f, chunk_i, V, logits.stride(0),
                              *strides, CHUNK=chunk, CAP=cap, PENALTIES=on, num_warps=8)
    _merge_kernel[(B,)](chunk_f, chunk_i, row_f, row_i, nchunk, NC_BLOCK=nc_block, CAP=cap, GCAP=global_cap,
                        CAND=triton.next_power_of_2(nchunk * cap), num_warps=8)
    _count_kernel[(B, nchunk)](logits, *pen, temperature, top_k, top_p, row_f, row_i, partial, V, logits.stride(0),
                               *strides, CHUNK=chunk, SUB=min(chunk, 512), GCAP=global_cap, PB=8, PENALTIES=on,
                               num_warps=8)
    _select_kernel[(B,)](logits, *pen, temperature, top_k, top_p, min_p, seeds, steps, row_f, row_i, partial, out,
                         V, nchunk, logits.stride(0), *strides, NC_BLOCK=nc_block, GCAP=global_cap,
                         TILE=min(chunk, 1024), PENALTIES=on, num_warps=4)
    return out


def sample(logits, temperature, top_k, top_p, min_p, seeds, steps, penalties: Penalties | None = None):
    """One sampling step for a batch: logits [B, V] fp32 (raw) -> token ids [B] int64; the same tokens as
    apply_penalties_ref + sample_ref. CUDA: Triton, graph-capturable; CPU: the references."""
    if logits.is_cuda:
        return sample_triton(logits, temperature, top_k, top_p, min_p, seeds, steps, penalties)
    if penalties is not None:
        logits = apply_penalties_ref(logits.clone(), *penalties)
    return sample_ref(logits, temperature, top_k, top_p, min_p, seeds, steps)


# Grammar masks: a bit per token (bit i % 32 of int32 word i // 32; engine/grammar.py fills them on the host, as
# llguidance writes them); a token whose bit is 0 gets -inf before penalties, temperature and the filters.

def token_mask_ref(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """logits [B, V] fp32, mask [B, ceil(V / 32)] int32 -> logits with the tokens the mask leaves out at -inf."""
    V = logits.shape[-1]
    bits = (mask.unsqueeze(-1) >> torch.arange(32, device=mask.device, dtype=torch.int32)) & 1
    allowed = bits.reshape(mask.shape[0], -1)[:, :V].bool()
    return logits.masked_fill(~allowed, float("-inf"))


@triton.jit
def _token_mask_kernel(logits_ptr, mask_ptr, out_ptr, V, stride_l, stride_m, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < V
    x = tl.load(logits_ptr + row * stride_l + offs, mask=valid)
    word = tl.load(mask_ptr + row * stride_m + offs // 32, mask=valid, other=0)
    allowed = ((word >> (offs % 32)) & 1) != 0
    tl.store(out_ptr + row * stride_l + offs, tl.where(allowed, x, NEG_INF), mask=valid)


def token_mask_triton(logits: torch.Tensor, mask: torch.Tensor, block: int = 4096) -> torch.Tensor:
    B, V = logits.shape
    logits = logits.contiguous()
    out = torch.empty_like(logits)
    _token_mask_kernel[(B, triton.cdiv(V, block))](logits, mask, out, V, logits.stride(0), mask.stride(0),
                                                   BLOCK=block, num_warps=4)
    return out


def token_mask(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """token_mask_ref; on CUDA one Triton launch (graph-capturable, no host sync). A new tensor: the raw logits
    stay as they were (logprobs report the model's own distribution)."""
    return token_mask_triton(logits, mask) if logits.is_cuda else token_mask_ref(logits, mask)


# Logprobs: log-softmax of the raw logits at the chosen tokens and the top n (n <= 20), without writing the
# [B, V] log-softmax: per chunk the softmax partials and the chunk's top n, then per row the merge.

@triton.jit
def _top_n(x, idx, valid, out_x, out_i, shift, count, N: tl.constexpr):
    """Store the N best ranked valid lanes (larger first, lower index on a tie) minus shift, the first
    `count` of them; ids are NONE past the valid lanes."""
    key = tl.where(valid, _rank_key(x, idx), LOWEST)
    bound = tl.full((), 9223372036854775807, tl.int64)
    for j in range(N):
        bound = tl.max(tl.where(key < bound, key, LOWEST), axis=0)
        v, i = _unrank(bound)
        tl.store(out_x + j, v - shift, mask=j < count)
        tl.store(out_i + j, i, mask=j < count)


@triton.jit
def _logprob_scan_kernel(logits_ptr, chunk_f, chunk_i, V, stride_l, CHUNK: tl.constexpr, N: tl.constexpr):
    """chunk_f [B, chunks, 2 + N]: max, sum exp(l - max), top-N logits; chunk_i [B, chunks, N]: their ids."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = offs < V
    x = tl.load(logits_ptr + row * stride_l + offs, mask=mask, other=NEG_INF).to(tl.float32)
    m = tl.max(x, axis=0)
    slot = row * tl.num_programs(1) + chunk
    f = chunk_f + slot * (2 + N)
    tl.store(f, m)
    tl.store(f + 1, tl.sum(tl.where(x > NEG_INF, tl.exp(x - m), 0.0), axis=0))
    _top_n(x, offs, mask, f + 2, chunk_i + slot * N, 0.0, N, N)


@triton.jit
def _logprob_merge_kernel(logits_ptr, tokens_ptr, chunk_f, chunk_i, lp_ptr, val_ptr, ids_ptr, NCHUNK, stride_l, n,
                          NC_BLOCK: tl.constexpr, N: tl.constexpr, CAND: tl.constexpr):
    row = tl.program_id(0)
    c = tl.arange(0, NC_BLOCK)
    cf = chunk_f + (row * NCHUNK + c) * (2 + N)
    cmax = tl.load(cf, mask=c < NCHUNK, other=NEG_INF)
    m = tl.max(cmax, axis=0)
    total = tl.sum(tl.where(cmax > NEG_INF, tl.load(cf + 1, mask=c < NCHUNK, other=0.0) * tl.exp(cmax - m), 0.0),
                   axis=0)
    lse = m + tl.log(total)
    token = tl.load(tokens_ptr + row)
    tl.store(lp_ptr + row, tl.load(logits_ptr + row * stride_l + token).to(tl.float32) - lse)
    k = tl.arange(0, CAND)
    kc = k // N
    kj = k % N
    x = tl.load(chunk_f + (row * NCHUNK + kc) * (2 + N) + 2 + kj, mask=kc < NCHUNK, other=NEG_INF)
    idx = tl.load(chunk_i + (row * NCHUNK + kc) * N + kj, mask=kc < NCHUNK, other=NONE)
    _top_n(x, idx, idx != NONE, val_ptr + row * N, ids_ptr + row * N, lse, n, N)


def token_logprobs_triton(logits, tokens, n: int, chunk: int = 4096):
    B, V = logits.shape
    assert logits.stride(1) == 1 and n <= V
    dev = logits.device
    N = max(n, 1)
    nchunk = triton.cdiv(V, chunk)
    chunk_f = torch.empty(B, nchunk, 2 + N, dtype=torch.float32, device=dev)
    chunk_i = torch.empty(B, nchunk, N, dtype=torch.int32, device=dev)
    lp = torch.empty(B, dtype=torch.float32, device=dev)
    values = torch.empty(B, N, dtype=torch.float32, device=dev)
    ids = torch.empty(B, N, dtype=torch.int64, device=dev)
    _logprob_scan_kernel[(B, nchunk)](logits, chunk_f, chunk_i, V, logits.stride(0), CHUNK=chunk, N=N, num_warps=8)
    _logprob_merge_kernel[(B,)](logits, tokens, chunk_f, chunk_i, lp, values, ids, nchunk, logits.stride(0), n,
                                NC_BLOCK=triton.next_power_of_2(nchunk), N=N,
                                CAND=triton.next_power_of_2(nchunk * N), num_warps=8)
    return lp, values[:, :n], ids[:, :n]


def token_logprobs(logits, tokens, n: int):
    """Log-softmax of the raw logits [B, V] fp32 at tokens [B] int: (logprobs [B], top-n logprobs [B, n],
    their ids [B, n] int64, most likely first). Never writes the [B, V] log-softmax on CUDA."""
    if logits.is_cuda:
        return token_logprobs_triton(logits, tokens, n)
    logprobs, values, ids = top_logprobs_ref(logits, n)
    return logprobs.gather(1, tokens.long().view(-1, 1)).squeeze(1), values, ids
