"""The forwards the readiness check records: each model shape's prefill chunk, decode steps and speculative rounds,
run by the engine's own code (Qwen3_5Model, RoundRunner, the sampler) on the meta device inside `recording`."""

from __future__ import annotations

import torch

from engine.cache.kv_format import KVFormat
from engine.core.params import MAX_BLOCK_DRAFTS, MAX_DRAFTS, EngineConfig
from engine.readiness.launches import Recorder
from engine.core.runner import BUCKETS
from qwendesk_kernels.gdn import RECURRENT_MAX_TOKENS

DEFAULTS = EngineConfig(model="")
PAGE = DEFAULTS.page_size
CONTEXT = 4096            # the context every sequence has cached (shapes only: nothing is allocated)
# a full chunk (fla's chunked GDN), a prompt's shorter last step (Triton's recurrent GDN) and one of a few rows
PREFILLS = (DEFAULTS.prefill_chunk, RECURRENT_MAX_TOKENS, 3)
DRAFTS = tuple(range(1, MAX_DRAFTS + 1))     # verify rows k + 1 per sequence: 2-48 over the BUCKETS (k > 3: opt-in)
BLOCK_DRAFTS = (MAX_BLOCK_DRAFTS,)           # a block drafter's rounds past those: 16 verify rows (two row tiles)


def model_on_meta(shape: str, weights: str, layers: int = 4):
    """`shape` (engine.bench.random_model.SHAPES): its real widths, `layers` layers (one of each kind) and MTP."""
    from engine.model.config import parse_model_config
    from engine.model.qwen3_5 import Qwen3_5Model
    from engine.core.params import EngineConfig
    from engine.bench.random_model import text_config
    raw = dict(text_config(shape), num_hidden_layers=layers)
    cfg = parse_model_config(raw)
    return Qwen3_5Model(cfg, torch.bfloat16, "meta", with_mtp=True, policy=EngineConfig(model="").policy(weights))


def pools_on_meta(model, kv: KVFormat, slots: int = 9):
    from engine.cache.pages import CacheTensors
    pages = max(BUCKETS) * (CONTEXT + 2 * PAGE) // PAGE
    return CacheTensors.allocate(model.cfg, pages, PAGE, slots, torch.bfloat16, "meta", mtp_layers=1, kv=kv)


@torch.inference_mode()
def run_all(rec: Recorder, shape: str, weights: str, kv: KVFormat | str) -> None:
    """Record the prefill steps, decode steps and greedy / sampled speculative rounds of every batch bucket, with KV
    format `kv` (or its name)."""
    from engine.model.batch import build_batch
    model = model_on_meta(shape, weights)
    pools = pools_on_meta(model, KVFormat(kv))
    tag = f"{shape} {weights} {kv} KV"
    per_seq = (CONTEXT + 2 * PAGE) // PAGE
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(max(BUCKETS))]

    for rows in PREFILLS:
        rec.where = f"{tag} prefill {rows}"
        batch = build_batch([rows], [CONTEXT - rows], [0], tables[:1], PAGE, "meta")
        _fla_index(batch, [0, rows])
        hidden = model(torch.zeros(rows, dtype=torch.int64, device="meta"), batch, pools)
        model.mtp_forward(torch.zeros(rows, dtype=torch.int64, device="meta"), hidden, batch, pools)
        model.logits(hidden[batch.logits_rows])

    for n in BUCKETS:
        rec.where = f"{tag} decode N={n}"
        batch = build_batch([1] * n, [CONTEXT - 1] * n, list(range(n)), tables[:n], PAGE, "meta")
        hidden = model(torch.zeros(n, dtype=torch.int64, device="meta"), batch, pools)
        _sample(model.logits(hidden))
    _rounds(rec, tag, model, pools, tables)


@torch.inference_mode()
def run_drafter(rec: Recorder, shape: str, weights: str, kv: KVFormat | str) -> None:
    """A block drafter of the published size (engine.bench.random_model.DRAFTERS) attached to `shape`'s model, beside
    KV format `kv`: whole greedy rounds of BLOCK_DRAFTS drafts of every bucket (verify rows past the MTP rounds' 6: the
    decode attention's row tiles); with bf16 and int8 (the drafter's own context formats beside those and the rest)
    also its context written by a prefill chunk and a decode step of every bucket, its block forward and draft picks
    (greedy and sampled) of every bucket."""
    from engine.bench.random_model import DRAFTERS, drafter_config
    from engine.cache.pages import CacheTensors
    from engine.model.batch import build_batch
    from engine.model.block_drafter import BlockDrafter
    from engine.model.drafter_config import parse_drafter_config
    from engine.model.linear import Build
    from engine.spec.block_rounds import BlockRoundRunner
    if shape not in DRAFTERS:
        return
    taps = len(DRAFTERS[shape][5])
    model = model_on_meta(shape, weights, layers=taps)
    cfg = parse_drafter_config(drafter_config(shape, list(range(taps))))
    drafter = BlockDrafter(cfg, Build(torch.bfloat16, "meta", DEFAULTS.policy(weights)))
    model.attach_drafter(drafter)
    pages = max(BUCKETS) * (CONTEXT + 2 * PAGE) // PAGE
    pools = CacheTensors.allocate(model.cfg, pages, PAGE, 9, torch.bfloat16, "meta", kv=KVFormat(kv),
                                  drafter=cfg)
    per_seq = (CONTEXT + 2 * PAGE) // PAGE
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(max(BUCKETS))]
    tag = f"{shape} {weights} {kv} KV drafter"
    own = KVFormat(kv) in (KVFormat.BF16, KVFormat.INT8)      # the drafter's context: 16-bit or int8
    if own:
        rec.where = f"{tag} prefill {DEFAULTS.prefill_chunk}"
        batch = build_batch([DEFAULTS.prefill_chunk], [0], [0], tables[:1], PAGE, "meta")
        _fla_index(batch, [0, DEFAULTS.prefill_chunk])
        model(torch.zeros(DEFAULTS.prefill_chunk, dtype=torch.int64, device="meta"), batch, pools)
    spec = BlockRoundRunner(model, pools, max(BLOCK_DRAFTS), max(BUCKETS), CONTEXT + 2 * PAGE, DEFAULTS.draft_vocab)
    for n in BUCKETS:
        inp = round_inputs_on_meta(tables[:n])
        if own:
            rec.where = f"{tag} decode N={n}"
            batch = build_batch([1] * n, [CONTEXT - 1] * n, list(range(n)), tables[:n], PAGE, "meta")
            model(torch.zeros(n, dtype=torch.int64, device="meta"), batch, pools)
            for sampled in (False, True):
                rec.where = f"{tag} block N={n}{' sampled' if sampled else ''}"
                spec.pick(*spec.draft_rows(inp, max(BLOCK_DRAFTS)), inp, sampled)
        for k in BLOCK_DRAFTS:
            rec.where = f"{tag} round N={n} k={k}"
            spec.round(inp, False, k)


# Images the tower encodes: the smallest the processor makes (65,536 px: 16 x 16 patches) and a 512 x 512 one
VISION_GRIDS = ((1, 16, 16), (1, 32, 32))


@torch.inference_mode()
def run_vision(rec: Recorder, shape: str, weights: str, policy=None) -> None:
    """The vision tower's forward as the engine loads it under `weights` (or under a QuantPolicy `policy`). The
    engine's policies keep the tower's linears 16-bit (cuBLAS, SDPA and torch ops): it makes no Triton launch as of
    now; any it makes later is recorded and checked."""
    from engine.model.config import parse_model_config
    from engine.model.linear import Build
    from engine.bench.random_model import wrapper_config
    from engine.vision.tower import VisionTower
    vision = parse_model_config(wrapper_config(shape)).vision
    assert vision is not None                   # the multimodal wrapper's config has its tower's
    tower = VisionTower(vision, Build(torch.bfloat16, "meta", policy or DEFAULTS.policy(weights)))
    patch = vision.in_channels * vision.temporal_patch_size * vision.patch_size ** 2
    for grid in VISION_GRIDS:
        rec.where = f"{shape} {weights} vision {grid[1] * vision.patch_size}x{grid[2] * vision.patch_size}"
        tower(torch.zeros(grid[0] * grid[1] * grid[2], patch, device="meta"), [grid])


def _fla_index(batch, cu: list[int]) -> None:
    """What gdn._fla_meta makes of the batch's cu_seqlens, from its host values (a meta tensor has none)."""
    from fla.ops.utils.index import prepare_chunk_indices

    from qwendesk_kernels import gdn
    cu_cpu = torch.tensor(cu, dtype=torch.int64)
    index = prepare_chunk_indices(cu_cpu, 64, cu_seqlens_cpu=cu_cpu)
    gdn._fla_meta_last = (batch.cu_seqlens, dict(cu_seqlens=batch.cu_seqlens.long(), cu_seqlens_cpu=cu_cpu,
                                                 chunk_indices=index))


def _sample(logits):
    from qwendesk_kernels.sampling import sample
    n = logits.shape[0]
    f = lambda v, dt=torch.float32: torch.full((n,), v, dtype=dt, device="meta")  # noqa: E731
    return sample(logits, f(0.7), f(20, torch.int64), f(0.9), f(0.0), f(1, torch.int64), f(0, torch.int64))


def round_inputs_on_meta(tables: list[list[int]]):
    """A sampled round's inputs for one sequence per page table, each at CONTEXT tokens with a page to grow into."""
    from engine.core.sampling import SamplingRow
    from engine.spec.rounds import RoundRequest, round_inputs
    reqs = [RoundRequest(slot=i, base=CONTEXT, last=0, pages=table, limit=CONTEXT + PAGE, snap_slot=8,
                         sampling=SamplingRow(0.7, 20, 0.9, 0.0, 1)) for i, table in enumerate(tables)]
    return round_inputs(reqs, len(tables[0]), "meta")


def _rounds(rec: Recorder, tag: str, model, pools, tables) -> None:
    from engine.spec.rounds import RoundRunner
    spec = RoundRunner(model, pools, max(DRAFTS), max(BUCKETS), CONTEXT + PAGE)
    for n in BUCKETS:
        inp = round_inputs_on_meta(tables[:n])
        for k in DRAFTS:
            for sampled in (False, True):
                rec.where = f"{tag} verify N={n} k={k}{' sampled' if sampled else ''}"
                spec.round(inp, sampled, k)
