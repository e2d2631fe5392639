"""The HTTP path's own cost: decode throughput in process against the same requests through the endpoint.

    python -m engine.bench.http --shape 9b            # GPU: random weights at the 9B shape, bf16
    python -m engine.bench.http --shape tiny          # CPU: a tiny random model (the overhead, magnified)

C clients each stream one completion of --tokens tokens (greedy, ignore_eos) from the same --prompt-token
prompts, all at once; aggregate tok/s = C x tokens / (first submit -> last token). In process the requests
go to Engine.submit and their handles are read as they come; through HTTP a separate client process (so
that its parsing does not share this process's GIL) streams them from POST /v1/completions (token-id
prompts: no chat template) on an endpoint served from this process, as qwendesk-serve serves it.
"""

from __future__ import annotations

import argparse
import http.client
import json
import subprocess
import sys
import threading
import time

import torch


def stand_in_tokenizer(vocab: int):
    """Every id decodes to a word of its own, so each token makes a text piece (as a real vocabulary does)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.models import WordLevel

    from engine.text.tokenizer import Tokenizer
    return Tokenizer(HFTokenizer(WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0")))


def build_engine(shape: str, clients: int, context: int):
    from engine.api import Engine, EngineConfig
    from engine.bench.random_model import build_random_model, text_config
    if shape == "tiny":
        raw = {**text_config("tiny"), "vocab_size": 4096, "eos_token_id": 4095}
        device = "cpu"
        model = build_random_model(raw, "bf16", device=device, dtype=torch.float32)
    else:
        raw = text_config(shape)
        device = "cuda"
        model = build_random_model(raw, "bf16")
    config = EngineConfig(model="", device=device, profile=f"C{clients}", max_context=context, max_queue=16,
                          speculative_tokens=0)
    return Engine.from_model(config, model, stand_in_tokenizer(raw["vocab_size"]))


def prompts(n: int, length: int, vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab - 1, (length,), generator=gen).tolist() for _ in range(n)]


def in_process(engine, ids: list[list[int]], tokens: int) -> float:
    from engine.api import SamplingParams
    t0 = time.perf_counter()
    handles = [engine.submit(p, SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)) for p in ids]
    done = [[ev for ev in h][-1] for h in handles]
    assert all(ev.usage.completion_tokens == tokens for ev in done)
    return len(ids) * tokens / (time.perf_counter() - t0)


def through_http(url: str, ids: list[list[int]], tokens: int) -> float:
    """Runs the clients in a child process; -> aggregate tok/s."""
    out = subprocess.run([sys.executable, "-m", "engine.bench.http", "--client", url, "--tokens", str(tokens)],
                         input=json.dumps(ids), capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["tok_s"]


def client_main(url: str, tokens: int) -> None:
    """The client process: every prompt streamed at once, one thread each."""
    ids = json.loads(sys.stdin.read())
    host, port = url.split("//")[1].split(":")
    counts = [0] * len(ids)
    start = threading.Barrier(len(ids) + 1)

    def one(i: int) -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=600)
        body = json.dumps({"model": "bench", "prompt": ids[i], "max_tokens": tokens, "temperature": 0,
                           "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
        start.wait()
        conn.request("POST", "/v1/completions", body=body, headers={"content-type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        for line in resp:
            if line.startswith(b"data: {") and b'"usage":{' in line:
                counts[i] = json.loads(line[6:])["usage"]["completion_tokens"]
        conn.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(ids))]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    assert counts == [tokens] * len(ids), counts
    print(json.dumps({"tok_s": sum(counts) / wall}))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.bench.http", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="9b", choices=["tiny", "9b", "27b"])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3, help="each way, alternating; the best of each is reported")
    ap.add_argument("--stream-interval", type=float, nargs="*", default=[0.0], metavar="S",
                    help="the server's stream_interval_s; several: one HTTP measurement each")
    ap.add_argument("--profile", metavar="FILE", help="cProfile the server's event loop thread into FILE")
    ap.add_argument("--client", metavar="URL", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.client:
        client_main(args.client, args.tokens)
        return 0
    if args.shape != "tiny" and not torch.cuda.is_available():
        print("the 9b and 27b shapes need a CUDA GPU (--shape tiny runs on the CPU)", file=sys.stderr)
        return 2
    from engine.server import ServerSettings, ServerThread, create_app
    engine = build_engine(args.shape, args.clients, args.prompt_tokens + args.tokens + 64)
    ids = prompts(args.clients, args.prompt_tokens, engine.model_config.vocab_size)
    settings = ServerSettings(model_id="bench")
    server = ServerThread(create_app(settings, engine), port=0)
    if args.profile:
        import cProfile
        profiler = cProfile.Profile()
        run = server.server.run
        server.thread._target = lambda: profiler.runcall(run)  # type: ignore[attr-defined]  # the thread, profiled
    server.start()
    in_process(engine, ids, 16)                 # warm-up: this batch's shapes, both ways
    through_http(server.url, ids, 16)
    ours: list[float] = []
    http_: dict[float, list[float]] = {s: [] for s in args.stream_interval}
    for _ in range(args.rounds):
        ours.append(in_process(engine, ids, args.tokens))
        for interval in args.stream_interval:
            settings.stream_interval_s = interval
            http_[interval].append(through_http(server.url, ids, args.tokens))
        print(f"round: in process {ours[-1]:.0f}, HTTP {[round(v[-1]) for v in http_.values()]} tok/s", flush=True)
    server.stop()
    engine.close()
    if args.profile:
        profiler.dump_stats(args.profile)
    best_in = max(ours)
    print(f"shape {args.shape}, C{args.clients}, {args.clients} streaming clients x {args.tokens} tokens, "
          f"prompts of {args.prompt_tokens}; rounds: in process {[round(x) for x in ours]}, "
          f"HTTP {({s: [round(x) for x in v] for s, v in http_.items()})}")
    print("| path | aggregate tok/s | ratio |\n|---|---|---|")
    print(f"| in process | {best_in:.0f} | 1.00 |")
    for interval, values in http_.items():
        best = max(values)
        print(f"| HTTP (SSE), stream interval {interval * 1e3:g} ms | {best:.0f} | {best / best_in:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
