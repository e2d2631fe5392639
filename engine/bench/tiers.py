"""The cache tiers at real shapes: `qwendesk-bench --cache-tiers [--tiers-context 32768] [--tiers-kv int8,bf16]
[--no-tiers-decode]`.

Per KV dtype (int8, bf16): a conversation of --tiers-context tokens is answered by an engine writing the disk tier;
the engine is closed (its writes finish) and the files are dropped from the OS page cache (fsync + fadvise), so
that the next start really reads the disk. Then the next turn's TTFT: after a restart with the disk tier (read
during the request), after a restart and Engine.warm (disk -> host before the request: the app's path), and cold (a
fresh engine without tiers). Also the host -> GPU restore bandwidth (HostCache.load_pages of the conversation's
pages), the disk's read speed (the tier's files read back cold, one at a time and READ_THREADS at a time as the
tier reads them), decode tok/s of one stream while a restored request's disk reads run (they run beside the loop),
and decode tok/s of one stream while the writer thread writes a just-finished long request's pages, each beside the
same stream alone.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from engine.cache.disk import READ_THREADS
from engine.cache.kv_format import KVFormat

KV_FORMATS = list(KVFormat)     # what a report lists, when measured

RESTORE_DECODE_TOKENS = 512     # the stream decoding while a restored request's reads run (~3 s at 27B int4 C1)


def drop_page_cache(folder: Path) -> int:
    """Flush the files under `folder` and ask the OS to drop them from its page cache; returns their bytes."""
    total = 0
    for path in folder.rglob("*.kv"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            total += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return total


def disk_read_gbps(folder: Path, threads: int) -> float:
    """The tier's files read back from the disk (not the page cache), `threads` files at a time."""
    from concurrent.futures import ThreadPoolExecutor
    nbytes = drop_page_cache(folder)
    t = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(Path.read_bytes, folder.rglob("*.kv")))
    seconds = time.perf_counter() - t
    drop_page_cache(folder)
    return nbytes / seconds / 1e9


def restore_gbps(eng, n_pages: int) -> tuple[float, float]:
    """(HostCache.load_pages GB/s, plain pinned -> GPU copy GB/s) for n_pages pages of this (closed) engine's layout,
    in a pool of their own."""
    from engine.cache.host import HostCache
    from engine.cache.pages import CacheTensors
    pools = CacheTensors.allocate(eng.model_config, n_pages, eng.config.page_size, 2, eng._dtype, eng.device,
                                  kv=eng.plan().kv_dtype)
    host = HostCache(pools, (n_pages + 1) * pools.page_nbytes)      # every page kept at once
    host.wait_allocated()
    keys = [i.to_bytes(16, "little") for i in range(n_pages)]
    host.put_pages(keys, list(range(n_pages)))
    host.load_pages(keys, list(range(n_pages)))            # first use: staging allocations
    torch.cuda.synchronize()
    t = time.perf_counter()
    host.load_pages(keys, list(range(n_pages)))
    torch.cuda.synchronize()
    restore = n_pages * pools.page_nbytes / (time.perf_counter() - t) / 1e9
    src = torch.empty(n_pages * pools.page_nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty_like(src, device="cuda")
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    t = time.perf_counter()
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    plain = src.numel() / (time.perf_counter() - t) / 1e9
    del pools, host, src, dst
    torch.cuda.empty_cache()
    return restore, plain


def decode_during_restore(eng, folder: Path, turn2: list[int]) -> dict:
    """Decode tok/s of one stream alone, then while a request for turn2 waits for its prefix to be read from the disk
    tier (C1: it waits for the stream's slot too; its reads start at once and run beside the loop, so the stream
    should not stop for them). Closes eng."""
    from engine.api import SamplingParams
    from engine.bench.random_model import rand_ids
    greedy: dict[str, Any] = dict(temperature=0.0, ignore_eos=True)
    decode = SamplingParams(max_tokens=RESTORE_DECODE_TOKENS, **greedy)
    try:
        eng.generate(rand_ids(512, 3), SamplingParams(max_tokens=8, **greedy))     # warm-up at this shape
        alone = eng.generate(rand_ids(512, 4), decode).timings.decode_tok_s
        drop_page_cache(folder)
        events = iter(eng.submit(rand_ids(512, 5), decode))
        first = next(events)                                                       # decoding now
        restored = eng.generate(turn2, SamplingParams(max_tokens=1, **greedy))
        during = [first, *events][-1].timings.decode_tok_s
    finally:
        eng.close()
    return {"decode_alone_tok_s": alone, "decode_during_restore_tok_s": during, "decode_restore_ratio": during / alone,
            "restore_cached": restored.usage.cached_tokens}


def bench_tiers(model, args) -> dict:
    from engine.api import Engine, EngineConfig, SamplingParams
    from engine.bench.random_model import bench_tokenizer, rand_ids

    tok = bench_tokenizer()
    n = args.tiers_context
    greedy: dict[str, Any] = dict(temperature=0.0, ignore_eos=True)
    turn1 = rand_ids(n, 1)
    res: dict[str, Any] = {"context": n}

    def engine(kv, **tiers):
        config = EngineConfig(model=f"random-{args.shape}-{args.weights}-seed0", device="cuda", profile="C1",
                              max_context=n + 2048, kv_dtype=kv, prefill_chunk=args.prefill_chunk, **tiers)
        return Engine.from_model(config, model, tok)

    def ttft(eng, prompt):
        out = eng.generate(prompt, SamplingParams(max_tokens=1, **greedy))
        return out.timings.ttft_ms, out.usage.cached_tokens

    for kv in args.tiers_kv:
        folder = Path(tempfile.mkdtemp(prefix=f"qwendesk-tiers-{kv}-"))
        tiers = dict(disk_cache=True, disk_cache_dir=str(folder))
        eng = engine(kv, **tiers)
        reply = eng.generate(turn1, SamplingParams(max_tokens=64, **greedy)).token_ids
        turn2 = turn1 + reply + rand_ids(64, 2)
        eng.close()
        r: dict[str, Any] = {"disk_bytes": drop_page_cache(folder)}
        eng = engine(kv, **tiers)
        r["restart_ttft_ms"], r["restart_cached"] = ttft(eng, turn2)
        eng.close()
        drop_page_cache(folder)
        eng = engine(kv, **tiers)
        t = time.perf_counter()
        eng.warm(turn2).result()
        r["warm_ms"] = 1e3 * (time.perf_counter() - t)
        r["warmed_ttft_ms"], r["warmed_cached"] = ttft(eng, turn2)
        eng.close()                     # (its pools give their memory back for the restore pools)
        r["restore_gbps"], r["pinned_copy_gbps"] = restore_gbps(eng, n // eng.config.page_size)
        eng = engine(kv, host_cache_gb=0)
        r["cold_ttft_ms"], _ = ttft(eng, turn2)
        eng.close()
        r.update(decode_during_restore(engine(kv, **tiers), folder, turn2))
        r["disk_read_gbps"] = disk_read_gbps(folder, 1)
        r["disk_read_parallel_gbps"] = disk_read_gbps(folder, READ_THREADS)
        r["restart_vs_cold"] = r["restart_ttft_ms"] / r["cold_ttft_ms"]
        r["warmed_vs_cold"] = r["warmed_ttft_ms"] / r["cold_ttft_ms"]
        res[kv] = r
        print(f"{kv} KV: {r}", flush=True)

    if not args.tiers_decode:
        return res
    # decode of one stream alone, then while the writer thread writes a just-finished long request's pages
    with tempfile.TemporaryDirectory(prefix="qwendesk-tiers-write-") as write_dir:
        eng = Engine.from_model(EngineConfig(model=f"random-{args.shape}-write", device="cuda", profile="C1",
                                             max_context=n + 2048, prefill_chunk=args.prefill_chunk, disk_cache=True,
                                             disk_cache_dir=write_dir), model, tok)
        disk = eng._disk
        assert disk is not None                              # (disk_cache=True)
        decode = SamplingParams(max_tokens=args.decode_tokens, **greedy)
        eng.generate(rand_ids(512, 3), decode)               # warm-up at this shape (its own write is small)
        disk.flush()
        alone = eng.generate(rand_ids(512, 4), decode).timings.decode_tok_s
        disk.flush()
        eng.generate(rand_ids(n, 5), SamplingParams(max_tokens=1, **greedy))   # its pages are queued for writing
        t = time.perf_counter()
        during = eng.generate(rand_ids(512, 6), decode)
        decode_s = time.perf_counter() - t
        disk.flush()
        write_s = time.perf_counter() - t
        res["decode_alone_tok_s"], res["decode_during_write_tok_s"] = alone, during.timings.decode_tok_s
        res["decode_ratio"] = during.timings.decode_tok_s / alone
        res["write_s"], res["decode_s"] = write_s, decode_s
        eng.close()
    return res


def report(res: dict) -> None:
    print(f"\ncache tiers, {res['context']}-token conversation:")
    print("| KV | cold TTFT | restart TTFT (disk) | ratio | warmed TTFT | ratio | warm() | restore GB/s "
          f"| pinned copy GB/s | disk read GB/s (1 / {READ_THREADS} files at a time) | disk MB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for kv in KV_FORMATS:
        if kv not in res:
            continue
        r = res[kv]
        print(f"| {kv} | {r['cold_ttft_ms']:.0f} ms | {r['restart_ttft_ms']:.0f} ms ({r['restart_cached']} cached) "
              f"| {r['restart_vs_cold']:.1%} | {r['warmed_ttft_ms']:.0f} ms | {r['warmed_vs_cold']:.1%} "
              f"| {r['warm_ms']:.0f} ms | {r['restore_gbps']:.1f} | {r['pinned_copy_gbps']:.1f} "
              f"| {r['disk_read_gbps']:.2f} / {r['disk_read_parallel_gbps']:.2f} | {r['disk_bytes'] / 1e6:.0f} |")
    for kv in KV_FORMATS:
        if kv in res:
            r = res[kv]
            print(f"{kv} KV: decode of one stream while a restored request's reads run "
                  f"{r['decode_during_restore_tok_s']:.1f} tok/s against {r['decode_alone_tok_s']:.1f} alone "
                  f"({r['decode_restore_ratio']:.3f}x; the request then had {r['restore_cached']} tokens cached)")
    if "decode_ratio" not in res:
        return
    print(f"decode tok/s alone {res['decode_alone_tok_s']:.1f}, during a background disk write "
          f"{res['decode_during_write_tok_s']:.1f} ({res['decode_ratio']:.3f}x); the write took {res['write_s']:.1f} s "
          f"from the decode's start, the decode {res['decode_s']:.1f} s")
