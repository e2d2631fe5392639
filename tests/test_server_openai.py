"""The OpenAI routes through the official `openai` SDK against a real server on a loopback port:
chat (streamed and not), reasoning, tools, logprobs, usage, plain completions, models, errors."""

import json

import jsonschema
import openai
import pydantic
import pytest

from tests.server_harness import MODEL, engine, raw, reset, server, steer  # noqa: F401 (fixtures)

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}]
CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
        "</parameter>\n</function>\n</tool_call>")
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


ENGINE_PROFILE = "C2"


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def chat(client, **kw):
    kw.setdefault("model", MODEL)
    kw.setdefault("messages", USER)
    kw.setdefault("max_tokens", 100)
    return client.chat.completions.create(**kw)


def test_reasoning_and_content_are_separate(client, steer):
    steer.say("The user wants weather.</think>\n\nIt is sunny.")
    r = chat(client)
    m = r.choices[0].message
    assert m.content == "It is sunny."
    assert m.reasoning_content == m.reasoning == "The user wants weather."
    assert r.choices[0].finish_reason == "stop"
    u = r.usage
    assert u.prompt_tokens > 0 and u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.completion_tokens_details.reasoning_tokens == len(steer.tok.encode("The user wants weather."))
    assert u.prompt_tokens_details.cached_tokens == 0


def test_thinking_off_by_reasoning_effort_and_template_kwargs(client, steer):
    steer.say("Plain answer.")
    for kw in ({"reasoning_effort": "none"}, {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}):
        r = chat(client, **kw)
        m = r.choices[0].message
        assert m.content == "Plain answer." and getattr(m, "reasoning_content", None) is None
        assert r.usage.completion_tokens_details.reasoning_tokens == 0


def test_reasoning_effort_maps_to_a_thinking_budget(client, steer):
    steer.say("ok</think>\n\nfine")
    chat(client, reasoning_effort="low")
    assert steer.seen[-1].thinking_budget == 1024           # Qwen3.5's template has no effort knob
    chat(client, reasoning_effort="high")
    assert steer.seen[-1].thinking_budget is None


def test_stream_matches_and_reports_usage(client, steer):
    steer.say("Think a bit.</think>\n\nStreamed answer, in pieces.")
    chunks = list(chat(client, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
    assert (reasoning, content) == ("Think a bit.", "Streamed answer, in pieces.")
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert all(c.usage is None for c in chunks[:-1])


def test_max_tokens_and_max_completion_tokens(client, steer):
    steer.endless()
    assert chat(client, max_tokens=3).usage.completion_tokens == 3
    r = chat(client, max_tokens=50, max_completion_tokens=4)
    assert r.usage.completion_tokens == 4 and r.choices[0].finish_reason == "length"


def test_thinking_token_budget_closes_the_thinking(client, steer):
    steer.endless()
    r = chat(client, max_tokens=12, extra_body={"thinking_token_budget": 4})
    reasoning = r.usage.completion_tokens_details.reasoning_tokens
    assert 4 <= reasoning <= 6 and r.usage.completion_tokens == 12   # then the answer starts
    assert r.choices[0].message.content


def test_sampling_parameters_are_passed_and_seed_reproduces(client, steer):
    kw = dict(temperature=0.9, top_p=0.8, presence_penalty=0.5, frequency_penalty=0.3, seed=7, stop=["zz"],
              extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1})
    a, b = chat(client, **kw), chat(client, **kw)
    assert a.choices[0].message.reasoning_content == b.choices[0].message.reasoning_content
    p = steer.seen[-1]
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.repetition_penalty) == (0.9, 0.8, 20, 0.05, 1.1)
    assert (p.presence_penalty, p.frequency_penalty, p.seed, p.stop) == (0.5, 0.3, 7, ["zz"])


def test_logit_bias(client, engine):
    [a] = engine.tokenizer.encode("a")
    r = chat(client, reasoning_effort="none", max_tokens=3, logit_bias={str(a): 100}, temperature=0)
    assert r.choices[0].message.content == "aaa"


def test_stop_string_cuts_the_content(client, steer):
    steer.say("Done.</think>\n\nOne two STOP three")
    r = chat(client, stop="STOP")
    assert r.choices[0].message.content == "One two " and r.choices[0].finish_reason == "stop"


def test_too_many_or_too_long_stop_strings_are_a_400(client):
    with pytest.raises(openai.BadRequestError, match="stop takes at most 16 strings"):
        chat(client, stop=[f"s{i}" for i in range(17)])
    with pytest.raises(openai.BadRequestError, match="of at most 512 characters"):
        chat(client, stop=["x" * 513])


def test_logprobs(client, steer):
    steer.say("Hm.</think>\n\nYes, café.")
    r = chat(client, logprobs=True, top_logprobs=3)
    lp = r.choices[0].logprobs.content
    assert "".join(t.token for t in lp) == "Yes, café."          # content tokens only: no thinking, no tags
    assert bytes(b for t in lp for b in t.bytes).decode() == "Yes, café."
    assert all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in lp)


def test_cached_tokens_on_the_second_turn(client, steer):
    system = {"role": "system", "content": "You are a careful assistant. " * 30}
    first = [system, {"role": "user", "content": "First question?"}]
    steer.say("First answer.")
    r1 = chat(client, messages=first, reasoning_effort="none")
    steer.say("Second answer.")
    second = first + [{"role": "assistant", "content": r1.choices[0].message.content},
                      {"role": "user", "content": "And a second one?"}]
    r2 = chat(client, messages=second, reasoning_effort="none")
    assert r2.usage.prompt_tokens_details.cached_tokens >= 128


def test_tool_call_parsed_and_finish_reason(client, steer):
    steer.say("I need the weather.</think>\n\nLet me check.\n\n" + CALL)
    r = chat(client, tools=TOOLS)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls"
    assert c.message.content == "Let me check."
    [call] = c.message.tool_calls
    assert call.id.startswith("call_") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}


def test_tool_call_streams_name_first_then_arguments(client, steer):
    steer.say("Hm.</think>\n\n" + CALL + "\n" + CALL.replace("Paris", "Oslo"))
    chunks = list(chat(client, tools=TOOLS, stream=True))
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    starts = [d for d in deltas if d.function.name]
    assert [(d.index, d.function.name, d.function.arguments) for d in starts] == [(0, "get_weather", ""),
                                                                                  (1, "get_weather", "")]
    assert all(d.id.startswith("call_") for d in starts)
    args = {i: "".join(d.function.arguments or "" for d in deltas if d.index == i) for i in (0, 1)}
    assert json.loads(args[0]) == {"city": "Paris", "days": 3} and json.loads(args[1])["city"] == "Oslo"
    assert len([d for d in deltas if d.index == 0]) > 2              # arguments came in pieces
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_sdk_stream_helper_accumulates_tool_calls(client, steer):
    steer.say("Hm.</think>\n\n" + CALL)
    with client.chat.completions.stream(model=MODEL, messages=USER, tools=TOOLS, max_tokens=80) as stream:
        final = stream.get_final_completion()
    call = final.choices[0].message.tool_calls[0]
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}


def test_tool_results_go_back_through_the_template(client, engine, steer):
    history = USER + [
        {"role": "assistant", "content": None, "reasoning_content": "I should call the tool.", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
    steer.say("Hm.</think>\n\nIt is 18 C and sunny.")
    r = chat(client, messages=history, tools=TOOLS)
    assert r.choices[0].message.content == "It is 18 C and sunny."
    expected = engine.template.render(
        USER + [{"role": "assistant", "content": "", "reasoning_content": "I should call the tool.", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": "18 C, sunny"}], tools=TOOLS)
    assert "<tool_response>\n18 C, sunny\n</tool_response>" in expected and "I should call the tool." in expected
    assert r.usage.prompt_tokens == len(engine.tokenizer.encode(expected))


def test_tool_choice_named_forces_the_call(client, steer):
    for effort in ("none", "high"):                    # thinking off and on: the call follows the thinking
        steer.endless()
        r = chat(client, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}},
                 reasoning_effort=effort, max_tokens=30, extra_body={"thinking_token_budget": 3})
        assert r.choices[0].message.tool_calls[0].function.name == "get_weather"


def test_tool_choice_required_makes_valid_calls(client, steer):
    params = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"type": "integer"}},
              "required": ["city", "days"]}        # bounded: the random model ends its text by reaching the bound
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": params}}]
    for seed in range(3):          # the (random) model's own arguments, under the tool-call grammar
        r = chat(client, tools=tools, tool_choice="required", reasoning_effort="none", max_tokens=300, seed=seed,
                 temperature=1.0)
        m = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls" and m.content is None and m.tool_calls
        for call in m.tool_calls:
            jsonschema.validate(json.loads(call.function.arguments), params)


def test_tool_choice_none_bans_calls(client, steer):
    steer.say("Hm.</think>\n\nNo call.")
    chat(client, tools=TOOLS, tool_choice="none")
    procs = steer.seen[-1].logits_processors
    assert type(procs[0]).__name__ == "BanTokens"


def test_parallel_tool_calls_false_keeps_one_call(client, steer):
    steer.say("Hm.</think>\n\n" + CALL + "\n" + CALL)
    r = chat(client, tools=TOOLS, parallel_tool_calls=False, max_tokens=100)
    assert len(r.choices[0].message.tool_calls) == 1


def test_plain_completions(client, steer):
    steer.say(" world, again.")
    r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=20, echo=True, logprobs=2)
    c = r.choices[0]
    assert c.text == "Hello world, again." and c.finish_reason == "stop"
    # echo with logprobs: the prompt's tokens come first, scored (the first has none), as OpenAI's legacy API does
    assert c.logprobs.text_offset[0] == 0 and "".join(c.logprobs.tokens) == "Hello world, again."
    assert c.logprobs.token_logprobs[0] is None and c.logprobs.top_logprobs[0] is None
    steer.reset()
    steer.endless()             # the random model could sample its stop token: every reply runs to max_tokens
    r = client.completions.create(model=MODEL, prompt=["one", [10, 11, 12]], max_tokens=3)
    assert [c.index for c in r.choices] == [0, 1] and r.usage.completion_tokens == 6
    chunks = list(client.completions.create(model=MODEL, prompt=["a", "b"], max_tokens=3, stream=True,
                                            stream_options={"include_usage": True}))
    assert {c.choices[0].index for c in chunks if c.choices} == {0, 1}
    assert chunks[-1].usage.completion_tokens == 6


def test_models(client, engine):
    [m] = client.models.list().data
    assert m.id == MODEL and m.max_model_len == engine.max_context
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


@pytest.mark.parametrize("kw, param", [
    (dict(n=17), "n"),
    (dict(modalities=["text", "audio"]), "modalities"),
    (dict(audio={"voice": "alloy", "format": "wav"}), "audio"),
    (dict(prediction={"type": "content", "content": "x"}), "prediction"),
    (dict(web_search_options={"search_context_size": "low"}), "web_search_options"),
    (dict(extra_body={"verbosity": "low"}), "verbosity"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}]),
     "tools.0.function.parameters"),
    (dict(functions=[{"name": "f", "parameters": {"properties": 5}}]), "functions.0.parameters"),
    (dict(functions=[{"name": "f"}], tools=[{"type": "function", "function": {"name": "g"}}]), "functions"),
    (dict(response_format={"type": "xml"}), "response_format"),
    (dict(temperature=3), "temperature"),
    (dict(logit_bias={"abc": 5}), "logit_bias"),
    (dict(tool_choice="required"), "tool_choice"),
    (dict(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]),
     "messages.0.content.0"),
    (dict(messages=[{"role": "wizard", "content": "hi"}]), "messages.0.role"),
    (dict(extra_body={"chat_template_kwargs": {"tools": []}}), "chat_template_kwargs"),
])
def test_bad_requests_are_400_with_the_openai_envelope(client, kw, param):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, **kw)
    assert e.value.status_code == 400
    err = e.value.body
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]


def test_fields_that_ask_for_nothing_or_change_nothing_are_accepted(client, steer):
    steer.say("Hm.</think>\n\nok")
    r = chat(client, modalities=["text"], web_search_options=None, store=True, metadata={"a": "b"}, user="u",
             service_tier="auto", prompt_cache_key="k", extra_body={"verbosity": "medium", "langchain_extra": 1})
    assert r.choices[0].message.content == "ok"


def test_images_say_there_is_no_vision(client):
    with pytest.raises(openai.BadRequestError, match="has no vision"):
        chat(client, messages=[{"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}])


def test_context_length_exceeded(client, engine):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, max_tokens=engine.max_context)
    assert e.value.code == "context_length_exceeded" and str(engine.max_context) in e.value.message
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        chat(client, messages=[{"role": "user", "content": "word " * 1200}], max_tokens=1)


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as e:
        chat(client, model="gpt-4o")
    assert e.value.code == "model_not_found"


def test_invalid_json_and_wrong_types_are_400(server):
    lone_surrogate = ('{"model": "' + MODEL + '", "messages": [{"role": "user", "content": "\\ud800"}]}').encode()
    for body in (b"{not json", b"", b"[1, 2]", b"\xff\xfe{}", b"[" * 100_000, lone_surrogate,
                 {"model": MODEL, "messages": "hi"}, {"model": MODEL}):
        status, _, out = raw(server, "POST", "/v1/chat/completions", body)
        assert status == 400, (body, out)
        assert json.loads(out)["error"]["type"] == "invalid_request_error"


LONG_USER = [{"role": "user", "content": "Tell me about the weather in Paris in spring, " * 12}]


def test_n_samples_share_the_prompt_and_sum_usage(client, steer, engine):
    steer.say("Hm.</think>\n\nok")
    one = chat(client, messages=LONG_USER)
    hits = engine.stats()["prefix_hit_tokens"]
    fresh = [{"role": "user", "content": LONG_USER[0]["content"].replace("Paris", "Oslo")}]
    r = chat(client, messages=fresh, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(c.message.content == "ok" and c.finish_reason == "stop" for c in r.choices)
    assert r.usage.completion_tokens == 3 * one.usage.completion_tokens
    # samples 2 and 3 started once the first had prefilled: their prompt (to the last page before the
    # reply's <|im_start|>) came from the prefix cache
    page = engine.config.page_size
    assert engine.stats()["prefix_hit_tokens"] - hits >= 2 * (r.usage.prompt_tokens - 2 * page)
    steer.say("Hm.</think>\n\nok")
    assert chat(client, messages=fresh).usage.prompt_tokens == r.usage.prompt_tokens    # counted once
    steer.say("Hm.</think>\n\nok")
    chunks = list(chat(client, messages=LONG_USER, n=2, stream=True, stream_options={"include_usage": True}))
    texts = {i: "".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
             for i in (0, 1)}
    assert texts == {0: "ok", 1: "ok"}
    assert sorted(c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason) == [0, 1]
    assert chunks[-1].usage.completion_tokens == 2 * one.usage.completion_tokens


def test_n_samples_with_a_seed_differ_and_reproduce(client):
    kw = dict(n=2, seed=7, temperature=1.0, max_tokens=8, reasoning_effort="none", extra_body={"ignore_eos": True})
    a, b = chat(client, **kw), chat(client, **kw)
    texts = [c.message.content for c in a.choices]
    assert texts == [c.message.content for c in b.choices] and texts[0] != texts[1]


def test_n_plain_completions(client, steer):
    steer.endless()
    r = client.completions.create(model=MODEL, prompt=["one", "two"], max_tokens=3, n=2)
    assert [c.index for c in r.choices] == [0, 1, 2, 3] and r.usage.completion_tokens == 12


def test_legacy_functions_map_to_tools(client, steer, engine):
    functions = [t["function"] for t in TOOLS]
    steer.say("Hm.</think>\n\n" + CALL)
    r = chat(client, functions=functions)
    c = r.choices[0]
    assert c.finish_reason == "function_call" and not c.message.tool_calls
    assert c.message.function_call.name == "get_weather"
    assert json.loads(c.message.function_call.arguments) == {"city": "Paris", "days": 3}
    steer.say("Hm.</think>\n\n" + CALL)
    chunks = list(chat(client, functions=functions, stream=True))
    calls = [c.choices[0].delta.function_call for c in chunks if c.choices and c.choices[0].delta.function_call]
    assert calls[0].name == "get_weather"
    assert json.loads("".join(f.arguments or "" for f in calls)) == {"city": "Paris", "days": 3}
    assert chunks[-1].choices[0].finish_reason == "function_call"
    steer.say("Hm.</think>\n\n" + CALL + "\n" + CALL)     # function_call by name: that call, one only
    r = chat(client, functions=functions, function_call={"name": "get_weather"})
    assert r.choices[0].message.function_call.name == "get_weather" and r.choices[0].finish_reason == "function_call"
    steer.say("Hm.</think>\n\nIt is 18 C.")             # the legacy history: assistant function_call, function role
    history = USER + [{"role": "assistant", "content": None,
                       "function_call": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                      {"role": "function", "name": "get_weather", "content": "18 C"}]
    r = chat(client, messages=history, functions=functions)
    assert r.choices[0].message.content == "It is 18 C."
    expected = engine.template.render(USER + [{"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "18 C"}], tools=TOOLS)
    assert "<tool_response>\n18 C\n</tool_response>" in expected
    assert r.usage.prompt_tokens == len(engine.tokenizer.encode(expected))


def test_chunk_template_writes_the_same_bytes():
    from engine.server.http.sse import ChunkTemplate, dumps, event
    meta = {"id": "chatcmpl-1", "created": 5, "model": "m\u00e9", "object": "chat.completion.chunk"}
    for usage in (False, True):
        for delta in ({"content": "a\"b\n\u2603"}, {"reasoning_content": "x", "reasoning": "x"}):
            data = {**meta, "choices": [{"index": 3, "delta": delta, "logprobs": None, "finish_reason": None}]}
            expected = event({**data, "usage": None} if usage else data)
            assert ChunkTemplate(meta, "delta", usage)(3, dumps(delta)) == expected


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=6)
    sunny: bool
    days: list[int] = pydantic.Field(max_length=2)


def test_structured_output_parse_with_a_pydantic_model(client):
    """The SDK's chat.completions.parse sends the model's strict JSON schema; the (random) model's reply parses."""
    for seed in range(3):
        r = client.chat.completions.parse(model=MODEL, messages=USER, response_format=City, max_tokens=300,
                                          seed=seed, temperature=1.0, reasoning_effort="none")
        assert r.choices[0].finish_reason == "stop" and isinstance(r.choices[0].message.parsed, City)


def test_json_object_and_completions(client, steer):
    steer.say('{"city": "Paris", "days": [1, 2]}')
    r = chat(client, response_format={"type": "json_object"}, reasoning_effort="none")
    assert json.loads(r.choices[0].message.content) == {"city": "Paris", "days": [1, 2]}
    steer.reset()
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    c = client.completions.create(model=MODEL, prompt="Answer:", max_tokens=50, temperature=1.0, seed=3,
                                  extra_body={"response_format": {"type": "json_schema",
                                                                  "json_schema": {"name": "a", "schema": schema}}})
    jsonschema.validate(json.loads(c.choices[0].text), schema)


@pytest.mark.parametrize("fmt, words", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}, "Invalid type: strin"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"if": {}, "then": {}}}}, "Unimplemented keys"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": []}}, "must be a JSON object"),
])
def test_bad_schemas_are_400_naming_the_problem(client, fmt, words):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, response_format=fmt)
    assert words in e.value.body["message"]


def test_invalid_tool_schema_is_400(client):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "integr"}}}}}]
    with pytest.raises(openai.BadRequestError, match=r"tools.0.function.parameters is not a valid JSON Schema: at "
                                                     r".properties.n.type: 'integr'"):
        chat(client, tools=tools)
