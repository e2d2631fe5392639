"""Decode attention at long context, per KV format (GPU):
`python -m qwendesk_kernels.bench_attention_long [--lengths 32768,131072,262144] [--batch 1] [--splits 0,64,128]`.

27B shapes (Hq 24, Hkv 4, D 256, page 64, shuffled pages), one query row per sequence, replayed from a CUDA graph
as the engine runs it. Counted by the bytes the format must read (K, V and their scales) against the card's
device-to-device copy bandwidth (read + write, qwendesk_kernels.bench.ceilings). For k8v4 / k4v4 two rows: the
kernels alone (decode_attention4 on a rotated q) and the layer's call (ops.paged_attention: + the rotation of q and
of the output). --splits: context splits to try besides the engine's choice (attention.decode_num_splits; 0 = it).
"""

from __future__ import annotations

import argparse

import torch

from qwendesk_kernels import attention_kv4 as kv4
from qwendesk_kernels.attention import decode_attention, decode_num_splits
from qwendesk_kernels.bench import ceilings, graph_replay, time_us
from qwendesk_kernels.runtime import sm_count

HQ, HKV, D, PAGE = 24, 4, 256, 64
GROUP = 64                      # engine/kv_cache.py KV4_GROUP
DEV = "cuda"


def pools(kv: str, batch: int, length: int) -> tuple[list, int]:
    """Random (k, v, k_scale, v_scale) pools of format `kv` as engine/kv_cache.py kv_layouts makes them, holding `batch`
    sequences of `length` tokens, and the bytes decode reads."""
    lead = (batch * -(-length // PAGE), PAGE, HKV)
    bf16 = lambda: torch.randn(lead + (D,), dtype=torch.bfloat16, device=DEV)                    # noqa: E731
    int8 = lambda: torch.randint(-127, 128, lead + (D,), dtype=torch.int8, device=DEV)           # noqa: E731
    int4 = lambda: torch.randint(0, 256, lead + (D // 2,), dtype=torch.uint8, device=DEV)        # noqa: E731
    row_scale = lambda: 0.01 + 0.01 * torch.rand(lead, device=DEV)                              # noqa: E731
    group_scale = lambda: (0.01 + 0.01 * torch.rand(lead + (D // GROUP,), device=DEV)).half()   # noqa: E731
    out = {"bf16": lambda: [bf16(), bf16(), None, None],
           "int8": lambda: [int8(), int8(), row_scale(), row_scale()],
           "k8v4": lambda: [int8(), int4(), row_scale(), group_scale()],
           "k4v4": lambda: [int4(), int4(), group_scale(), group_scale()]}[kv]()
    nbytes = sum(batch * length * HKV * t[0, 0, 0].numel() * t.element_size() for t in out if t is not None)
    return out, nbytes


def measure(kv: str, batch: int, length: int, splits: int, layer_call: bool) -> tuple[float, int]:
    """(microseconds per decode step, bytes read)."""
    (k, v, ks, vs), nbytes = pools(kv, batch, length)
    pages = -(-length // PAGE)
    tables = torch.randperm(batch * pages, device=DEV).int().view(batch, pages)
    seq_lens = torch.full((batch,), length, dtype=torch.int32, device=DEV)
    cu = torch.arange(batch + 1, dtype=torch.int32, device=DEV)
    q = torch.randn(batch, HQ, D, dtype=torch.bfloat16, device=DEV)
    if layer_call:
        def fn():
            return kv4.paged_attention(q, k, v, tables, cu, seq_lens, D ** -0.5, k_scale=ks, v_scale=vs,
                                       decode_q_len=1, max_seq_len=length)
    elif kv4.is_kv4(v):
        def fn():
            return kv4.decode_attention4(q, k, v, tables, seq_lens, D ** -0.5, 1, splits, ks, vs)
    else:
        def fn():
            return decode_attention(q, k, v, tables, seq_lens, D ** -0.5, 1, splits, k_scale=ks, v_scale=vs)
    return time_us(graph_replay(fn)), nbytes


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="32768,131072,262144")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--splits", default="0", help="comma-separated; 0: the engine's choice")
    ap.add_argument("--formats", default="bf16,int8,k8v4,k4v4")
    args = ap.parse_args(argv)
    copy = ceilings()["copy_tbps"] * 1e3
    print(f"{torch.cuda.get_device_name()}, {sm_count(torch.device(DEV))} SMs, copy {copy:.0f} GB/s")
    print("| KV | call | batch | context | splits | us | GB/s | of copy bw |")
    print("|---|---|---|---|---|---|---|---|")
    for length in [int(x) for x in args.lengths.split(",")]:
        for kv in args.formats.split(","):
            for splits in [int(x) for x in args.splits.split(",")]:
                s = splits or decode_num_splits(args.batch, HKV, length, sm_count(torch.device(DEV)))
                calls = ["kernels", "layer"] if kv in ("k8v4", "k4v4") and not splits else ["kernels"]
                for call in calls:
                    us, nbytes = measure(kv, args.batch, length, s, call == "layer")
                    gbps = nbytes / us / 1e3
                    print(f"| {kv} | {call} | {args.batch} | {length} | {s} | {us:.1f} | {gbps:.0f} "
                          f"| {gbps / copy:.0%} |", flush=True)
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
