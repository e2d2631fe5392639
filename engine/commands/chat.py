"""`qwendesk-chat --model PATH_OR_REPO_ID`: a terminal chat that streams replies."""

from __future__ import annotations

import sys

from engine.commands.args import Parser, add_speculation_args, checked, model_arg, resolve_model, speculation_settings
from engine.core.params import DTYPE_NAMES, EngineConfig, SamplingParams

DIM, RESET = ("\033[2m", "\033[0m") if sys.stdout.isatty() else ("", "")


def chat_main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="qwendesk-chat", description="Chat with a Qwen3.5-family checkpoint.")
    ap.add_argument("--model", required=True, type=model_arg,
                    help="checkpoint directory, or a Hugging Face repo id to download")
    ap.add_argument("--device", default="auto", help="auto | cuda | cuda:N | cpu")
    ap.add_argument("--dtype", default="auto", choices=DTYPE_NAMES)
    add_speculation_args(ap)
    ap.add_argument("--max-tokens", type=int, default=1024)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--top-k", type=int, default=20)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--system", default=None, help="system prompt")
    ap.add_argument("--no-think", action="store_true", help="turn the model's thinking off")
    args = ap.parse_args(argv)
    config = checked(ap, EngineConfig(model=args.model, device=args.device, dtype=args.dtype,
                                      **speculation_settings(args)))
    params = checked(ap, SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                                        top_k=args.top_k, seed=args.seed, skip_special_tokens=False))

    from engine.api import Engine

    print(f"loading {args.model} ...", file=sys.stderr)
    try:
        config.model = resolve_model(config.model)
        engine = Engine(config)
    except (OSError, ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    messages = [{"role": "system", "content": args.system}] if args.system else []
    print("ready. Empty line or Ctrl-D to quit.", file=sys.stderr)
    while True:
        try:
            user = input("> ")
        except (EOFError, KeyboardInterrupt):
            break
        if not user.strip():
            break
        messages.append({"role": "user", "content": user})
        reply = []
        try:
            handle = engine.submit(messages, params, enable_thinking=not args.no_think)
            thinking = False
            for ev in handle:
                if ev.reasoning:
                    if not thinking:
                        sys.stdout.write(DIM)
                        thinking = True
                    sys.stdout.write(ev.reasoning)
                if ev.text:
                    if thinking:
                        sys.stdout.write(RESET + "\n")
                        thinking = False
                    reply.append(ev.text)
                    sys.stdout.write(ev.text)
                sys.stdout.flush()
                if ev.finish_reason == "error":
                    print(f"\nerror: {ev.error}", file=sys.stderr)
            if thinking:
                sys.stdout.write(RESET)
        except KeyboardInterrupt:
            handle.cancel()
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            messages.pop()
            continue
        sys.stdout.write("\n")
        messages.append({"role": "assistant", "content": "".join(reply)})
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(chat_main())
