"""Grammar-constrained decoding with llguidance: a request's Constraint -> a Matcher per sequence -> token masks.

The engine asks for the masks of a step's sequences after it has fed each one the tokens before (engine/core/loop.py
_decode), and the sampler sets the tokens a mask leaves out to -inf on the device (qwendesk_kernels/sampling.py
token_mask) before penalties, temperature and the filters. A Matcher starts at once, or on its trigger token: </think>
(the thinking stays free; the grammar then begins with an optional blank line, the one the chat template puts there), or
<tool_call> in the content (tool_choice auto: the call is constrained once the model opens it). When the grammar
cannot go on, the request ends (finish_reason stop); where it may end, the end-of-sequence tokens are allowed.

llguidance picked over xgrammar on the real 248K Qwen3.5 vocabulary: grammars compile in milliseconds instead of
about half a second, masks cost about as much, and it has no dependencies (docs/performance.md).
"""

from __future__ import annotations

import json
import re
import threading

import llguidance
import torch

try:
    import re._parser as regex_parser       # Python 3.11+
except ImportError:
    import sre_parse as regex_parser        # 3.10

from engine.chat.tool_grammar import calls_rules
from engine.chat.tools import TOOL_CLOSE, TOOL_OPEN, tool_schemas
from engine.core.params import Constraint
from engine.text.tokenizer import bytes_to_unicode

# JSON as models write it on one line ({"a": 1, "b": [2, 3]}): fixed separators, no free whitespace (a model could
# otherwise pad with blanks for ever)
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": False}
SEPARATOR = "\n\n"          # what the chat template writes after </think>
LIMITS = llguidance.LLParserLimits(verbose_errors=False)
# the most characters a schema's regular expression may spell out through counted repetitions: llguidance builds its
# lexer lazily, on the engine's thread, when decoding reaches the value, so ^((a{1000}){1000}){1000}$ would stall
# every request for seconds and then fail mid-reply ("too many expressions constructed")
MAX_PATTERN_SIZE = 20_000


class Matcher:
    """One sequence's grammar state. `active`: the grammar has started (tokens go to it, masks come from it)."""

    def __init__(self, ll: llguidance.LLMatcher, trigger: int | None, banned: tuple[int, ...] = ()):
        """banned: tokens left out until the grammar starts (the end of sequence while the thinking must close)."""
        self.ll, self.trigger, self.banned = ll, trigger, banned
        self.active = trigger is None

    def advance(self, token: int, kind: str) -> bool:
        """Feed a token the sequence just took (kind: the OutputStream's content / reasoning / control). False
        when the grammar refuses it."""
        if not self.active:
            self.active = token == self.trigger and kind != "reasoning"
            return True
        return self.ll.consume_token(token)

    @property
    def done(self) -> bool:
        """The grammar is complete and allows nothing more."""
        return self.active and self.ll.is_stopped()

    @property
    def error(self) -> str:
        return _one_line(self.ll.get_error())


class Grammars:
    """The engine's grammar compiler: llguidance's view of the tokenizer (made on first use: a second or two and
    ~50 MiB for the 248K vocabulary) and constraints compiled into Matchers."""

    def __init__(self, tokenizer, vocab_size: int):
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self.words = -(-vocab_size // 32)               # int32 words of one mask row
        self._ll: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()

    def matcher(self, constraint: Constraint, in_reasoning: bool) -> Matcher:
        """A new Matcher for a request whose reply starts inside the thinking (`in_reasoning`) or not. ValueError
        (one line) when the constraint cannot be compiled: an invalid schema, a keyword it cannot enforce."""
        grammar, trigger = self.grammar(constraint, in_reasoning)
        ll = llguidance.LLMatcher(self._tokenizer(), grammar, log_level=0, limits=LIMITS)
        if ll.is_error():
            raise ValueError(_one_line(ll.get_error()))
        thinking = trigger is not None and trigger == self.tokenizer.think_end_id
        return Matcher(ll, trigger, tuple(self.tokenizer.eos_token_ids) if thinking else ())

    def grammar(self, c: Constraint, in_reasoning: bool) -> tuple[str, int | None]:
        """The constraint as an llguidance grammar, and the token that starts it (None: the first one)."""
        tok = self.tokenizer
        open_id, close_id = tok.token_to_id(TOOL_OPEN), tok.token_to_id(TOOL_CLOSE)
        rules, content = [], []
        if c.tools:
            if open_id is None or close_id is None:
                raise ValueError("this model's vocabulary has no tool-call tokens")
            schemas = tool_schemas(c.tools)
            for name, schema in schemas.items():
                check_patterns(schema, f"tool {name!r}")
            if c.tool_name is not None and c.tool_name not in schemas:
                raise ValueError(f"tool_choice names {c.tool_name!r}, which is not one of the tools")
            rules.append(calls_rules(schemas, open_id, close_id, JSON_OPTIONS, only=c.tool_name,
                                     parallel=c.parallel and c.tool_name is None, check=check_schema))
            content.append("calls")
        if c.json_schema is not None and not (c.tools and c.tool_mode == "required"):
            check_schema(c.json_schema, "the JSON schema")
            rules.append(f"json_body: %json {json.dumps({**c.json_schema, 'x-guidance': JSON_OPTIONS})}")
            content.insert(0, "json_body")
        if c.tools and c.tool_mode == "auto" and c.json_schema is None:     # free text until the model opens a call
            more = ' ("\\n" call)*' if c.parallel else ""
            return llguidance.LLMatcher.grammar_from_lark("\n".join([f"start: call_body{more}"] + rules)), open_id
        think_end = tok.think_end_id if in_reasoning else None
        body = content[0] if len(content) == 1 else f"({' | '.join(content)})"
        start = f"start: {json.dumps(SEPARATOR) + '? ' if think_end is not None else ''}{body}"
        return llguidance.LLMatcher.grammar_from_lark("\n".join([start] + rules)), think_end

    def masks(self, matchers: list[Matcher | None]) -> torch.Tensor | None:
        """The token masks of a step's rows [N, words] int32 (a row of ones where there is no active grammar);
        None when no row has one."""
        rows = [(m.ll, i) for i, m in enumerate(matchers) if m is not None and m.active]
        banned = [(i, m.banned) for i, m in enumerate(matchers) if m is not None and not m.active and m.banned]
        if not rows and not banned:
            return None
        mask = torch.full((len(matchers), self.words), -1, dtype=torch.int32)
        for i, tokens in banned:
            for t in tokens:
                mask[i, t // 32] &= ~(1 << (t % 32)) if t % 32 < 31 else 0x7FFFFFFF
        if not rows:
            return mask
        known = -(-self._tokenizer().vocab_size // 32)     # the tokenizer's words; the model's rows past it stay out
        for ll, i in rows:      # one by one: llguidance's thread pool cost more than it saved at C2..C8 here
            mask[i, known:] = 0
            ll.unsafe_compute_mask_ptr(mask[i].data_ptr(), known * 4)
        return mask

    def _tokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._ll is None:
                self._ll = ll_tokenizer(self.tokenizer, self.vocab_size)
            return self._ll


def check_schema(schema: dict, where: str) -> None:
    """ValueError naming `where` when llguidance's JSON grammar refuses the schema (invalid, or a keyword it cannot
    enforce)."""
    check_patterns(schema, where)
    grammar = llguidance.LLMatcher.grammar_from_json_schema({**schema, "x-guidance": JSON_OPTIONS})
    bad, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, limits=LIMITS)
    if bad:
        raise ValueError(f"{where}: {_one_line(messages[0])}")


def check_patterns(schema, where: str, at: str = "") -> None:
    """ValueError naming the place of a `pattern` (or patternProperties name) in the schema that repeats too much."""
    if isinstance(schema, list):
        for i, item in enumerate(schema):
            check_patterns(item, where, f"{at}[{i}]")
        return
    if not isinstance(schema, dict):
        return
    patterns = [("pattern", schema["pattern"])] if isinstance(schema.get("pattern"), str) else []
    if isinstance(schema.get("patternProperties"), dict):
        patterns += [("patternProperties", p) for p in schema["patternProperties"]]
    for key, pattern in patterns:
        size = pattern_size(pattern)
        if size > MAX_PATTERN_SIZE:
            raise ValueError(f"{where}: {key} {pattern[:80]!r} at {at.lstrip('.') or 'the top'} repeats too much "
                             f"(it spells out {size} characters; at most {MAX_PATTERN_SIZE})")
    for key, value in schema.items():
        check_patterns(value, where, f"{at}.{key}")


def pattern_size(pattern: str) -> int:
    """The characters a regular expression spells out at most through its counted repetitions (an unbounded one counts
    its minimum); 0 for one Python cannot parse (llguidance then judges it)."""
    try:
        return _size(regex_parser.parse(pattern))
    except (re.error, RecursionError, OverflowError, ValueError):
        return 0


def _size(items) -> int:
    c = regex_parser
    repeats = (c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", c.MAX_REPEAT))
    total = 0
    for op, av in items:
        if op in repeats:
            lo, hi, sub = av
            total += max(lo if hi == c.MAXREPEAT else hi, 1) * _size(sub)
        elif op is c.SUBPATTERN:
            total += _size(av[-1])
        elif op is getattr(c, "ATOMIC_GROUP", None):
            total += _size(av)
        elif op is c.BRANCH:
            total += sum(_size(b) for b in av[1])
        elif op in (c.ASSERT, c.ASSERT_NOT):
            total += _size(av[1])
        else:
            total += 1
    return total


def ll_tokenizer(tokenizer, vocab_size: int) -> llguidance.LLTokenizer:
    """llguidance's tokenizer from the engine's (a byte-level BPE, as Qwen's): every token's bytes, the added
    tokens as special ones (a grammar names them by id; plain text never matches them), the end-of-sequence ids."""
    backend = tokenizer.backend
    added = backend.get_added_tokens_decoder()
    byte_of = {ch: b for b, ch in bytes_to_unicode().items()}
    tokens = []
    for i in range(backend.get_vocab_size(with_added_tokens=True)):
        text = backend.id_to_token(i) or ""
        if i in added:
            tokens.append(text.encode())
        else:
            try:
                tokens.append(bytes(byte_of[ch] for ch in text))
            except KeyError:
                raise ValueError("constrained decoding needs a byte-level BPE tokenizer (as Qwen's)") from None

    class Wrapped:
        eos_token_id = tokenizer.eos_token_ids[0] if tokenizer.eos_token_ids else None
        bos_token_id = None
        special_token_ids = sorted(added)

        def __init__(self):
            self.tokens = tokens

        def __call__(self, text):
            return tokenizer.encode(text.decode("utf-8", "replace") if isinstance(text, bytes) else text)

    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(Wrapped()), n_vocab=vocab_size,
                                  eos_token=list(tokenizer.eos_token_ids) or None)


def _one_line(text: str) -> str:
    return " ".join(line.strip() for line in text.strip().splitlines() if line.strip())
