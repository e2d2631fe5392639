"""Building an engine, in order: load the model (or wrap a built one), plan its memory once from what is free with the
weights in memory, then make what the loop runs: the cache pools and their manager, the tiers, the scheduler, the
model runner and speculation. Engine.__init__ calls these; nothing here runs after loading."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.cache.disk import DiskCache, default_root, namespace
from engine.cache.host import HostCache
from engine.cache.manager import CacheManager
from engine.cache.pages import CacheTensors
from engine.chat.template import ChatTemplate
from engine.core.device import graphs_on, on_gpu, probe
from engine.core.memory import MemoryPlan, budget_for, checkpoint_max_pixels, plan_for, plan_memory, vision_cost
from engine.core.params import EngineConfig
from engine.core.runner import ModelRunner, batch_buckets
from engine.core.scheduler import Scheduler
from engine.model.block_drafter import load_drafter
from engine.model.load import load_model
from engine.model.config import ModelConfig, load_model_config
from engine.model.layers import MLP
from engine.model.linear import Embedding, Linear
from engine.model.moe import SparseMoE
from engine.spec.block_rounds import BlockRoundRunner
from engine.spec.rounds import RoundRunner, Rounds
from engine.spec.speculation import Speculation, exact_verify_rows
from engine.text.grammar import Grammars
from engine.text.tokenizer import Tokenizer
from engine.vision.encoder import ImageEncoder
from engine.vision.processor import ImageProcessorConfig, load_processor_config
from engine.vision.tower import load_vision_tower
from engine.weights.convert_cache import source_identity
from qwendesk_kernels.moe_grouped import warm_up_tokens
from qwendesk_kernels.quant import WARM_UP_ROWS


@dataclass
class Loaded:
    """The model and what reads its prompts: what loading makes, before any cache exists."""
    model: torch.nn.Module                  # engine.model.qwen3_5.Qwen3_5Model
    model_config: ModelConfig
    tokenizer: Tokenizer
    template: ChatTemplate | None
    weights: str                            # bf16 | int4: what the weights were loaded as
    encoder: ImageEncoder | None = None     # with a vision tower that is on
    image_config: ImageProcessorConfig | None = None   # the checkpoint's preprocessor_config.json, with vision


@dataclass
class Parts:
    """What the loop runs, made from the plan."""
    pools: CacheTensors
    cache: CacheManager
    disk: DiskCache | None
    scheduler: Scheduler
    runner: ModelRunner
    spec: Speculation | None
    grammars: Grammars
    graphs: bool                            # decode steps and rounds replay CUDA graphs


def load(config: EngineConfig, device: torch.device, dtype: torch.dtype, progress) -> Loaded:
    """A checkpoint's model, tokenizer, template and vision tower. Refused with MemoryError, saying what would fit,
    before anything loads when the model's config alone shows it cannot (this check decides weights="auto")."""
    model_config = load_model_config(config.model)
    check = plan_for(config, probe(config.device), model=model_config)
    if not check.fits:
        raise MemoryError(check.message)
    weights = check.weights
    placement = check.vision
    method = check.method                   # the plan's: a drafter that does not fit leaves the MTP head (auto)
    model, vision_weights = load_model(config.model, device, dtype, mtp=method == "mtp", vision=placement != "off",
                                       policy=config.policy(weights), progress=progress)
    if method == "dflash":
        def drafter_progress(stage: str, done: int, total: int) -> None:
            progress(f"Block drafter: {stage[0].lower()}{stage[1:]}", done, total)
        model.attach_drafter(load_drafter(config.drafter, model_config, device, dtype, config.policy(weights),
                                          drafter_progress if progress else None))
    loaded = Loaded(model, model_config, Tokenizer.from_checkpoint(config.model),
                    ChatTemplate.from_checkpoint(config.model), weights)
    if placement != "off":                  # on demand: the tower is built in host memory
        assert model_config.vision is not None      # the plan places no tower where the model has none
        tower = load_vision_tower(model_config.vision, vision_weights, dtype,
                                  device if placement == "resident" else "cpu", config.policy(weights))
        loaded.encoder = ImageEncoder(tower, device, placement)
        loaded.image_config = load_processor_config(config.model)
    return loaded


def wrap(config: EngineConfig, device: torch.device, model, tokenizer, template=None, vision=None) -> Loaded:
    """An already built model (Engine.from_model)."""
    weights = "int4" if any(getattr(m, "scheme", "") == "int4" for m in model.modules()) else "bf16"
    loaded = Loaded(model, model.cfg, tokenizer, template, weights)
    if vision and config.vision != "off":
        tower, loaded.image_config, placement = vision
        loaded.encoder = ImageEncoder(tower, device, placement)
    return loaded


def plan(config: EngineConfig, loaded: Loaded, device: torch.device, dtype: torch.dtype, drafts: int) -> MemoryPlan:
    """The plan the engine runs with, made once, from what is free now that the weights are in memory; MemoryError
    when the cache does not fit."""
    gpu = on_gpu(device)
    held = torch.cuda.memory_allocated(device) if gpu else 0
    max_pixels = loaded.image_config.max_pixels if loaded.image_config else checkpoint_max_pixels(config.model)
    vision = dataclasses.replace(vision_cost(loaded.model_config, config, dtype, probe(config.device), max_pixels),
                                 placement=loaded.encoder.placement if loaded.encoder else "off")
    drafter = loaded.model.drafter          # what was loaded (a drafter that did not fit was not)
    made = plan_memory(loaded.model_config, config, dtype, weights_bytes=0,
                       budget_bytes=budget_for(config, probe(config.device), held), drafts=drafts, on_gpu=gpu,
                       vision=dataclasses.replace(vision, weights_bytes=0) if vision.placement == "resident"
                       else vision,     # a resident tower is in `held` already
                       drafter=drafter.cfg if drafts and drafter is not None else None)
    if not made.fits:
        raise MemoryError(made.message)
    weights_bytes = sum(t.numel() * t.element_size() for t in [
        *loaded.model.parameters(), *loaded.model.buffers(),
        *(loaded.encoder.tower.parameters() if loaded.encoder is not None and vision.placement == "resident"
          else ())])
    vision_bytes = vision.weights_bytes + vision.encode_bytes if vision.placement != "off" else made.vision_bytes
    return dataclasses.replace(made, weights=loaded.weights, weights_bytes=weights_bytes, vision_bytes=vision_bytes)


def assemble(config: EngineConfig, loaded: Loaded, memory: MemoryPlan, device: torch.device, dtype: torch.dtype,
             drafts: int, progress) -> Parts:
    """The cache pools and tiers, the scheduler, the runner (its decode graphs captured) and speculation (its
    rounds not yet captured: Speculation.capture)."""
    model = loaded.model
    drafter = model.drafter.cfg if drafts and model.drafter is not None else None
    pools = CacheTensors.allocate(loaded.model_config, memory.num_pages, config.page_size, memory.num_slots, dtype,
                                  device, mtp_layers=1 if model.mtp is not None else 0,
                                  kv=memory.kv_dtype, drafter=drafter)
    host = HostCache(pools, memory.host_cache_bytes) if memory.host_cache_bytes else None
    cache = CacheManager(pools, num_seq_slots=config.max_running, host=host)
    disk = DiskCache(config.disk_cache_dir or default_root(),
                     namespace(cache_identity(config, loaded.weights, dtype, pools)),
                     int(config.disk_cache_gb * (1 << 30)), memory.disk_staging_bytes) if config.disk_cache else None
    scheduler = Scheduler(cache, config.max_running, config.prefill_chunk,
                          im_start_id=loaded.tokenizer.token_to_id("<|im_start|>"))
    # decode steps and speculative rounds replay CUDA graphs: on a GPU, unless switched off or an MoE layer's int8
    # experts run a torch loop that learns their token counts on the host (engine/model/moe.py)
    graphs = (config.cuda_graphs and graphs_on(device)
              and all(m.graph_safe for m in model.modules() if isinstance(m, SparseMoE)))
    if graphs:
        progress("Capturing CUDA graphs", 0, 1)
    runner = ModelRunner(model, pools, device, max_batch=config.max_running, max_context=memory.max_context,
                         scratch_slot=cache.scratch_slot, cuda_graphs=graphs)
    spec = None
    if drafts:
        speculator: Rounds
        if drafter is not None:
            speculator = BlockRoundRunner(model, pools, drafts, config.max_running, memory.max_context,
                                          config.draft_vocab)
        else:
            speculator = runner.speculator = RoundRunner(model, pools, drafts, config.max_running,
                                                         memory.max_context, config.draft_vocab)
        spec = Speculation(speculator, cache, batch_buckets(config.max_running), graphs=graphs,
                           plain_times=runner.graphs.seconds if runner.graphs is not None else None,
                           max_rows=exact_verify_rows(loaded.weights, device))
    grammars = Grammars(loaded.tokenizer, loaded.model_config.vocab_size)
    return Parts(pools, cache, disk, scheduler, runner, spec, grammars, graphs)


def cache_identity(config: EngineConfig, weights: str, dtype: torch.dtype, pools: CacheTensors) -> dict:
    """What the disk tier's entries depend on besides their chain hash (engine.cache.disk.namespace). An engine
    around a given model (from_model) is known by config.model's text."""
    path = Path(config.model)
    policy = config.policy(weights)
    return {"source": source_identity(path) if path.is_dir() else {"name": config.model},
            "weights": weights, "policy": policy.key() if policy is not None else None,
            "dtype": str(dtype), "layout": pools.layout()}


def warm_up_linears(model, dtype: torch.dtype, device: torch.device, prefill_chunk: int, progress) -> None:
    """Run each quantized weight shape at WARM_UP_ROWS (2 .. FUSED_MAX_M rows: a prompt's last step, a short chat
    turn): the int4 GEMV's build for M > 1 and the autotuned kernels' M buckets, which otherwise compile and tune
    on first use (seconds each), and the int4 MLPs' SwiGLU in the GEMV's epilogue at those rows; and each kind of MoE
    layer at 1 token, at WARM_UP_ROWS and at the token counts that reach each block size of the grouped kernels
    (qwendesk_kernels/moe_grouped.warm_up_tokens; the routing, decode and grouped kernels' builds serve every T; int8
    experts: the sorted loop's GEMMs). Before the loop thread starts: the model is not yet shared."""
    moes = [m for m in model.modules() if isinstance(m, SparseMoE)]
    stacked = {id(lin) for m in moes for lin in (m.gate_up, m.down)}     # run by their layer, never whole
    linears = [m for m in model.modules()
               if isinstance(m, Linear) and not isinstance(m, Embedding) and id(m) not in stacked]
    shapes = {(m.int4_tiles, m.quantized().shape): m for m in linears + [model.lm_head]
              if m.scheme != "float"}
    kinds = {(m.gate_up.scheme, m.down.scheme): m for m in moes}
    mlps = {m.gate_up.quantized().shape: m for m in model.modules()
            if isinstance(m, MLP) and m.gate_up.scheme == "int4"}
    with torch.inference_mode():
        for i, linear in enumerate(shapes.values()):
            progress("Tuning kernels", i, len(shapes))
            for rows in WARM_UP_ROWS:
                linear(torch.zeros(rows, linear.shape[1], dtype=dtype, device=device))
        for mlp in mlps.values():
            for rows in WARM_UP_ROWS:
                mlp(torch.zeros(rows, mlp.gate_up.shape[1], dtype=dtype, device=device))
        for moe in kinds.values():
            experts = moe.gate_up.shape[0] // (2 * moe.inter)                 # (+ the stacked shared one)
            grouped = warm_up_tokens(moe.pairs, experts, prefill_chunk)
            for rows in sorted({1, *WARM_UP_ROWS, *grouped}):
                moe(torch.zeros(rows, moe.hidden, dtype=dtype, device=device))
