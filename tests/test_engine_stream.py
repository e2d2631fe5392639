"""What the engine's stream says it decided, on the CPU with a tiny checkpoint whose output a logits processor
scripts: the matched stop string, tool calls as structured pieces, and a kind for every token."""

import json

import pytest

from engine.api import (CallArgs, CallStart, Engine, EngineConfig, Reasoning, SamplingParams, Text, ToolCall,
                        tool_schemas)
from tests.server_harness import Script

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]
CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
        "</parameter>\n</function>\n</tool_call>")
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def eng(checkpoint):
    e = Engine(EngineConfig(model=str(checkpoint("base")), device="cpu", dtype="float32", max_context=1024,
                            page_size=16))
    yield e
    e.close()


def says(eng, text: str, **kw) -> SamplingParams:
    """Parameters under which the model writes exactly `text`, then its end-of-sequence token."""
    tok = eng.tokenizer
    return SamplingParams(max_tokens=kw.pop("max_tokens", 200), temperature=0.0,
                          logits_processors=[Script(tok.encode(text), tok.eos_token_ids[0])], **kw)


def joined(pieces: list) -> list:
    """The pieces with neighbours of one kind (and one call) run together."""
    out = []
    for p in pieces:
        last = out[-1] if out else None
        same_call = getattr(p, "index", 0) == getattr(last, "index", 0)
        if type(p) is type(last) and not isinstance(p, CallStart) and same_call:
            last.text += p.text
        else:
            out.append(type(p)(**vars(p)))
    return out


def test_the_stop_string_that_ended_the_reply_is_reported(eng):
    out = eng.generate(USER, says(eng, "one two END three NEVER", stop=["NEVER", "END"]), enable_thinking=False)
    assert (out.text, out.finish_reason, out.stop_sequence) == ("one two ", "stop", "END")
    ended = eng.generate(USER, says(eng, "one two", stop=["END"]), enable_thinking=False)
    assert (ended.text, ended.finish_reason, ended.stop_sequence) == ("one two", "stop", None)   # end of sequence
    cut = eng.generate(USER, says(eng, "one two three four", stop=["END"], max_tokens=2), enable_thinking=False)
    assert (cut.finish_reason, cut.stop_sequence) == ("length", None)


def test_tool_calls_come_out_as_structured_pieces(eng):
    handle = eng.submit(USER, says(eng, "Let me check.\n\n" + CALL), tools=TOOLS, enable_thinking=False)
    events = list(handle)
    pieces = joined([p for ev in events for p in ev.pieces])
    assert pieces[:2] == [Text("Let me check."), CallStart(0, "get_weather")] and len(pieces) == 3
    assert pieces[2].index == 0 and json.loads(pieces[2].text) == {"city": "Paris", "days": 3}
    assert sum(any(isinstance(p, CallArgs) for p in ev.pieces) for ev in events) > 2    # the arguments streamed
    assert events[-1].finish_reason == "tool_calls" and events[-1].stop_sequence is None
    out = eng.generate(USER, says(eng, CALL + "\n" + CALL.replace("Paris", "Oslo")), tools=TOOLS,
                       enable_thinking=False)
    assert out.text == "" and out.finish_reason == "tool_calls"
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [
        ("get_weather", {"city": "Paris", "days": 3}), ("get_weather", {"city": "Oslo", "days": 3})]


def test_without_tools_a_call_is_text_and_token_prompts_parse_only_when_given_tools(eng):
    plain = eng.generate(USER, says(eng, CALL), enable_thinking=False)
    assert plain.text == CALL and plain.tool_calls == [] and plain.finish_reason == "stop"
    ids = eng.encode_prompt(USER, tools=TOOLS, enable_thinking=False)
    assert eng.generate(ids, says(eng, CALL)).text == CALL
    parsed = eng.generate(ids, says(eng, CALL), tools=TOOLS)
    assert parsed.tool_calls == [ToolCall("get_weather", '{"city": "Paris", "days": 3}')] and parsed.text == ""


def test_unknown_tools_and_malformed_calls_stay_text(eng):
    other = CALL.replace("get_weather", "rm_rf")
    out = eng.generate(USER, says(eng, other), tools=TOOLS, enable_thinking=False)
    assert (out.text, out.tool_calls, out.finish_reason) == (other, [], "stop")
    assert tool_schemas(TOOLS) == {"get_weather": TOOLS[0]["function"]["parameters"]}


def test_token_kinds_line_up_with_the_tokens_and_the_text(eng):
    tok = eng.tokenizer
    events = list(eng.submit(USER, says(eng, "Weigh it up.</think>\n\nIt is sunny.")))
    ids = [t for ev in events for t in ev.token_ids]
    kinds = [k for ev in events for k in ev.token_kinds]
    assert all(len(ev.token_kinds) == len(ev.token_ids) for ev in events)
    assert set(kinds) <= {"content", "reasoning", "control"}
    pieces = [p for ev in events for p in ev.pieces]
    reasoning = "".join(p.text for p in pieces if isinstance(p, Reasoning))
    text = "".join(p.text for p in pieces if isinstance(p, Text))
    assert (reasoning, text) == ("Weigh it up.", "It is sunny.")
    assert tok.decode([t for t, k in zip(ids, kinds) if k == "reasoning"]) == reasoning
    assert tok.decode([t for t, k in zip(ids, kinds) if k == "content"]) == text
    control = [t for t, k in zip(ids, kinds) if k == "control"]
    assert control == [tok.think_end_id, *tok.encode("\n\n"), tok.eos_token_ids[0]]


def test_logprobs_and_kinds_share_the_token_order(eng):
    events = list(eng.submit(USER, says(eng, "ok</think>\n\nfine", logprobs=0)))
    deltas = [ev for ev in events if ev.kind == "delta"]
    assert all(len(ev.logprobs) == len(ev.token_kinds) == 1 and ev.logprobs[0].token_id == ev.token_ids[0]
               for ev in deltas)
