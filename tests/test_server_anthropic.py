"""The Anthropic routes through the official `anthropic` SDK against a real server on a loopback port:
messages (streamed and not), thinking blocks, tools, stop sequences, prefill, count_tokens, errors."""

import json

import anthropic
import pytest

from tests.server_harness import MODEL, engine, raw, reset, server, sse_events, steer  # noqa: F401 (fixtures)

TOOLS = [{"name": "get_weather", "description": "Weather for a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                           "required": ["city"]}}]
CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
        "</parameter>\n</function>\n</tool_call>")
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
THINK = {"type": "enabled", "budget_tokens": 64}     # (less than max_tokens, as Anthropic requires)


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


def create(client, **kw):
    kw.setdefault("model", MODEL)
    kw.setdefault("messages", USER)
    kw.setdefault("max_tokens", 100)
    return client.messages.create(**kw)


def test_text_reply_without_thinking_by_default(client, steer):
    steer.say("It is sunny.")
    m = create(client, system="Be brief.")
    assert m.id.startswith("msg_") and m.role == "assistant" and m.model == MODEL
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == "It is sunny."
    assert m.stop_reason == "end_turn" and m.stop_sequence is None
    assert m.usage.input_tokens > 0 and m.usage.output_tokens == len(steer.tok.encode("It is sunny.")) + 1
    assert m.usage.output_tokens_details.thinking_tokens == 0


def test_thinking_blocks(client, steer):
    steer.say("Weather question.</think>\n\nSunny.")
    m = create(client, thinking=THINK)
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking == "Weather question." and m.content[0].signature
    assert m.content[1].text == "Sunny."
    assert m.usage.output_tokens_details.thinking_tokens > 0
    steer.say("Secret.</think>\n\nSunny.")
    m = create(client, thinking={**THINK, "display": "omitted"})
    assert m.content[0].thinking == "" and m.content[0].signature


def test_thinking_budget_closes_the_thinking(client, steer):
    """After the forced </think> a random model writes the text: no added token there (a <tool_call> it opened left
    no text block, now and then) and room for visible text (a few tokens could all be pieces of one character)."""
    steer.endless()
    steer.ban += list(steer.tok.backend.get_added_tokens_decoder())
    m = create(client, thinking={"type": "enabled", "budget_tokens": 5}, max_tokens=40)
    assert 5 <= m.usage.output_tokens_details.thinking_tokens <= 7
    assert m.content[-1].type == "text" and m.stop_reason == "max_tokens"


def test_stream_event_sequence(client, steer, server):
    steer.say("Let me think.</think>\n\nSunny and warm.")
    with client.messages.stream(model=MODEL, max_tokens=100, messages=USER, thinking=THINK) as stream:
        kinds = [ev.type for ev in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "message_delta" in kinds
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == "Let me think." and final.content[1].text == "Sunny and warm."
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0
    steer.say("Sunny.")
    status, headers, body = raw(server, "POST", "/v1/messages", {"model": MODEL, "max_tokens": 20,
                                                                 "messages": USER, "stream": True})
    names = [name for name, _ in sse_events(body)]
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert names == ["message_start", "ping", "content_block_start", *["content_block_delta"] * (names.count(
        "content_block_delta")), "content_block_stop", "message_delta", "message_stop"]


def test_stop_sequences(client, steer):
    steer.say("one two END three")
    m = create(client, stop_sequences=["END", "NEVER"])
    assert m.content[0].text == "one two " and m.stop_reason == "stop_sequence" and m.stop_sequence == "END"


def test_too_many_stop_sequences_are_a_400(client):
    with pytest.raises(anthropic.BadRequestError, match="stop takes at most 16 strings"):
        create(client, stop_sequences=[f"s{i}" for i in range(17)])


def test_max_tokens_stop_reason(client, steer):
    steer.endless()
    m = create(client, max_tokens=5)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 5


def test_tool_use_round_trip(client, steer, engine):
    steer.say("I will look it up.\n\n" + CALL)
    m = create(client, tools=TOOLS)
    assert m.stop_reason == "tool_use"
    assert [b.type for b in m.content] == ["text", "tool_use"]
    use = m.content[1]
    assert use.id.startswith("toolu_") and use.name == "get_weather" and use.input == {"city": "Paris", "days": 3}
    steer.say("It is 18 C in Paris.")
    history = USER + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                    "content": "18 C, sunny"}]}]
    reply = create(client, tools=TOOLS, messages=history)
    assert reply.content[0].text == "It is 18 C in Paris." and reply.stop_reason == "end_turn"
    counted = client.messages.count_tokens(model=MODEL, messages=history, tools=TOOLS).input_tokens
    assert counted == reply.usage.input_tokens + reply.usage.cache_read_input_tokens
    expected = engine.template.render(
        USER + [{"role": "assistant", "content": "I will look it up.", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}}]},
            {"role": "tool", "content": "18 C, sunny"}],
        tools=[{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                                 "parameters": TOOLS[0]["input_schema"]}}],
        enable_thinking=False)
    assert "<tool_response>\n18 C, sunny\n</tool_response>" in expected
    assert counted == len(engine.tokenizer.encode(expected))


def test_tool_use_streams_input_json_deltas(client, steer):
    steer.say("Checking.\n\n" + CALL)
    with client.messages.stream(model=MODEL, max_tokens=100, messages=USER, tools=TOOLS) as stream:
        events = list(stream)
        final = stream.get_final_message()
    starts = [e for e in events if e.type == "content_block_start"]
    assert [s.content_block.type for s in starts] == ["text", "tool_use"]
    assert starts[1].content_block.name == "get_weather"
    pieces = [e.delta.partial_json for e in events
              if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
    assert len(pieces) > 1 and json.loads("".join(pieces)) == {"city": "Paris", "days": 3}
    assert final.content[1].input == {"city": "Paris", "days": 3} and final.stop_reason == "tool_use"


def test_tool_choice(client, steer):
    steer.endless()
    m = create(client, tools=TOOLS, tool_choice={"type": "tool", "name": "get_weather"}, max_tokens=20)
    assert any(b.type == "tool_use" and b.name == "get_weather" for b in m.content)
    steer.reset()
    steer.say("No tools.")
    create(client, tools=TOOLS, tool_choice={"type": "none"})
    assert type(steer.seen[-1].logits_processors[0]).__name__ == "BanTokens"
    steer.say(CALL + "\n" + CALL)
    m = create(client, tools=TOOLS, tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    assert [b.type for b in m.content] == ["tool_use"]


def test_prefill_continues_the_assistant_text(client, steer):
    steer.say(' "sunny"}')
    m = create(client, messages=USER + [{"role": "assistant", "content": '{"weather":'}])
    assert m.content[0].text == ' "sunny"}'


def test_count_tokens(client, engine):
    n = client.messages.count_tokens(model=MODEL, messages=USER, system="Be brief.").input_tokens
    text = engine.template.render([{"role": "system", "content": "Be brief."}, *USER], enable_thinking=False)
    assert n == len(engine.tokenizer.encode(text))


def test_images_say_there_is_no_vision(client):
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError, match="has no vision"):
        create(client, messages=[{"role": "user", "content": [image, {"type": "text", "text": "what is it?"}]}])


def test_models_list_in_anthropic_shape(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL] and models.data[0].type == "model"


@pytest.mark.parametrize("kw", [
    dict(max_tokens=0),
    dict(extra_body={"temperature": 1.5}),
    dict(messages=[]),
    dict(messages=[{"role": "system", "content": "x"}]),
    dict(tool_choice={"type": "any"}),
    dict(tools=[{"type": "web_search_20250305", "name": "web_search"}]),
    dict(tools=[{"name": "f", "input_schema": {"type": "object", "required": "city"}}]),
    dict(extra_body={"mcp_servers": [{"type": "url", "url": "https://mcp.example", "name": "x"}]}),
    dict(extra_body={"container": "container_1"}),
    dict(extra_body={"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}),
])
def test_bad_requests_use_the_anthropic_envelope(client, kw):
    with pytest.raises(anthropic.BadRequestError) as e:
        create(client, **kw)
    assert e.value.status_code == 400
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"


def test_unknown_model_and_context_length(client, engine):
    with pytest.raises(anthropic.NotFoundError) as e:
        create(client, model="not-this-model")
    assert e.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError, match="maximum context length"):
        create(client, max_tokens=engine.max_context)


def test_thinking_the_model_opens_mid_reply_is_dropped_without_thinking(client, steer, server):
    """Without `thinking` the template closes the thinking block; a <think> the model still writes
    mid-reply is not shown (as text or as a block): a reply with thinking off has none."""
    steer.say("Hello<think>secret plans</think> world")
    m = create(client)
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == "Hello world"
    assert "secret" not in json.dumps(m.model_dump())
    steer.say("Hello<think>secret plans</think> world")
    _, _, body = raw(server, "POST", "/v1/messages", {"model": MODEL, "max_tokens": 100, "messages": USER,
                                                      "stream": True})
    assert b"secret" not in body and b'"thinking"' not in body
    starts = [json.loads(d)["content_block"]["type"] for n, d in sse_events(body) if n == "content_block_start"]
    assert starts == ["text"]
    steer.say("Hello<think>plans</think> world")           # with thinking asked for, it is a block
    m = create(client, thinking=THINK)
    assert "plans" in [b.thinking for b in m.content if b.type == "thinking"][0]


def test_invalid_input_schema_names_the_tool(client):
    with pytest.raises(anthropic.BadRequestError, match=r"tools.0.input_schema is not a valid JSON Schema"):
        create(client, tools=[{"name": "f", "input_schema": {"type": "object", "properties": []}}])


def test_structured_output(client, steer):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 5}}, "required": ["city"],
              "additionalProperties": False}
    for field in ("output_config", "output_format"):
        fmt = {"type": "json_schema", "schema": schema}
        body = {"output_config": {"format": fmt}} if field == "output_config" else {"output_format": fmt}
        m = create(client, max_tokens=200, extra_body={**body, "temperature": 1.0})
        assert m.stop_reason == "end_turn" and json.loads(m.content[0].text)["city"] is not None
    with pytest.raises(anthropic.BadRequestError, match="Invalid type"):
        create(client, extra_body={"output_format": {"type": "json_schema", "schema": {"type": "nope"}}})
