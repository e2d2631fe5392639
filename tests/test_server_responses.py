"""POST /v1/responses through the official `openai` SDK (create, stream), openai-agents' default Runner
and LangChain's ChatOpenAI(use_responses_api=True), against a real server on a loopback port."""

import asyncio
import json

import openai
import pytest

from tests.server_harness import MODEL, Steering, engine, raw, reset, server, sse_events  # noqa: F401 (fixtures)

TOOL = {"type": "function", "name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                       "required": ["city"]}}
CHAT_TOOL = {"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}}
CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
        "</parameter>\n</function>\n</tool_call>")


class Turns(Steering):
    """`say(a, b, ...)`: the next replies are a, then b, ... (the last one repeats)."""

    def reset(self):
        super().reset()
        self.turns = []

    def say(self, *texts: str):
        self.turns = list(texts)

    def __call__(self, params):
        if self.turns:
            self.text = self.turns.pop(0) if len(self.turns) > 1 else self.turns[0]
        super().__call__(params)


@pytest.fixture(scope="module")
def steer(engine):  # noqa: F811 (replaces the harness's)
    return Turns(engine.tokenizer)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def create(client, **kw):
    kw.setdefault("model", MODEL)
    kw.setdefault("max_output_tokens", 100)
    return client.responses.create(**kw)


def chat_prompt_tokens(client, messages, **kw) -> int:
    """What the chat route counts for the same conversation (its reply does not matter)."""
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1, **kw)
    return r.usage.prompt_tokens


def test_string_input_reasoning_and_usage(client, steer):
    steer.say("The user greets.</think>\n\nHello there.")
    r = create(client, input="Hi!")
    assert r.id.startswith("resp_") and r.object == "response" and r.status == "completed"
    assert r.output_text == "Hello there."
    reasoning, message = r.output
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_") and reasoning.summary == []
    assert [c.text for c in reasoning.content] == ["The user greets."]
    assert message.type == "message" and message.status == "completed" and message.content[0].annotations == []
    u = r.usage
    assert u.output_tokens_details.reasoning_tokens == len(steer.tok.encode("The user greets."))
    assert u.total_tokens == u.input_tokens + u.output_tokens and u.input_tokens_details.cached_tokens == 0
    assert u.input_tokens == chat_prompt_tokens(client, [{"role": "user", "content": "Hi!"}])
    assert r.completed_at and r.tool_choice == "auto" and r.store is True and r.text.format.type == "text"


def test_items_and_instructions_render_as_the_chat_conversation(client, steer):
    steer.say("ok</think>\n\nfine")
    items = [{"role": "developer", "content": "Be brief."},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "One?"}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "1"}]},
             {"role": "user", "content": "Two?"}]
    r = create(client, input=items, instructions="You count.", metadata={"k": "v"})
    assert r.output_text == "fine" and r.instructions == "You count." and r.metadata == {"k": "v"}
    chat = [{"role": "system", "content": "You count.\n\nBe brief."}, {"role": "user", "content": "One?"},
            {"role": "assistant", "content": "1"}, {"role": "user", "content": "Two?"}]
    assert r.usage.input_tokens == chat_prompt_tokens(client, chat)


def test_function_call_round_trip(client, steer):
    steer.say("I need the weather.</think>\n\nLet me check.\n\n" + CALL, "Hm.</think>\n\nIt is 18 C.")
    question = [{"role": "user", "content": "Weather in Paris?"}]
    r = create(client, input=question, tools=[TOOL])
    reasoning, message, call = r.output
    assert message.content[0].text == "Let me check."
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    assert json.loads(call.arguments) == {"city": "Paris", "days": 3} and call.status == "completed"
    assert r.status == "completed" and r.tools[0].name == "get_weather"
    # the client keeps the state: earlier output items go back as input, with the call's result
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "18 C, sunny"}
    r2 = create(client, input=question + [item.model_dump(exclude_none=True) for item in r.output] + [result],
                tools=[TOOL])
    assert r2.output_text == "It is 18 C."
    chat = question + [
        {"role": "assistant", "content": "Let me check.", "reasoning_content": "I need the weather.",
         "tool_calls": [{"id": call.call_id, "type": "function",
                         "function": {"name": "get_weather", "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "18 C, sunny"}]
    assert r2.usage.input_tokens == chat_prompt_tokens(client, chat, tools=[CHAT_TOOL])
    # the server keeps the state: the same turn by previous_response_id renders the same prompt
    r3 = create(client, previous_response_id=r.id, input=[result], tools=[TOOL])
    assert r3.usage.input_tokens == r2.usage.input_tokens and r3.previous_response_id == r.id


def test_previous_response_id_reuses_the_prefix_cache(client, steer):
    instructions = "You are a careful assistant. " * 30
    steer.say("Hm.</think>\n\nFirst answer.", "Hm.</think>\n\nSecond answer.")
    r1 = create(client, instructions=instructions, input="First question?")
    r2 = create(client, instructions=instructions, input="And a second one?", previous_response_id=r1.id)
    assert r2.output_text == "Second answer."
    assert r2.usage.input_tokens_details.cached_tokens >= 128
    chat = [{"role": "system", "content": instructions}, {"role": "user", "content": "First question?"},
            {"role": "assistant", "content": "First answer.", "reasoning_content": "Hm."},
            {"role": "user", "content": "And a second one?"}]
    assert r2.usage.input_tokens == chat_prompt_tokens(client, chat)


def test_store_false_retrieve_and_delete(client, steer):
    steer.say("Hm.</think>\n\nkept")
    kept = create(client, input="Hi")
    assert client.responses.retrieve(kept.id).output_text == "kept"
    gone = create(client, input="Hi", store=False)
    assert gone.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(gone.id)
    with pytest.raises(openai.BadRequestError) as e:
        create(client, input="again", previous_response_id=gone.id)
    assert e.value.code == "previous_response_not_found" and e.value.param == "previous_response_id"
    client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept.id)


def test_stream_events_in_order(client, steer):
    steer.say("Think a bit.</think>\n\nStreamed answer, in pieces.")
    with client.responses.stream(model=MODEL, input="Hi", max_output_tokens=100) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    collapsed = [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1]]
    assert collapsed == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed"]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 2 and all(d.output_index == 1 and d.content_index == 0 for d in deltas)
    assert deltas[0].item_id == final.output[1].id
    assert "".join(d.delta for d in deltas) == final.output_text == "Streamed answer, in pieces."
    assert final.output[0].content[0].text == "Think a bit." and final.usage.output_tokens > 0
    assert events[0].response.status == "in_progress" and events[-1].response.status == "completed"
    kept = client.responses.retrieve(final.id)                                  # kept as the stream ended
    assert kept.output_text == final.output_text and [o.id for o in kept.output] == [o.id for o in final.output]


def test_stream_function_calls(client, steer):
    steer.say("Hm.</think>\n\n" + CALL + "\n" + CALL.replace("Paris", "Oslo"))
    with client.responses.stream(model=MODEL, input="Weather?", tools=[TOOL], max_output_tokens=120) as stream:
        events = list(stream)
        final = stream.get_final_response()
    calls = [o for o in final.output if o.type == "function_call"]
    assert [json.loads(c.arguments)["city"] for c in calls] == ["Paris", "Oslo"]
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [d.arguments for d in done] == [c.arguments for c in calls]
    assert len([e for e in events if e.type == "response.function_call_arguments.delta"]) > 4
    added = [e.item for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"]
    assert [a.call_id for a in added] == [c.call_id for c in calls] and all(a.arguments == "" for a in added)


def test_max_output_tokens_is_incomplete(client, server, steer):
    steer.endless()
    r = create(client, input="Hi", max_output_tokens=5)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 5 and r.output[-1].status == "incomplete"
    status, _, body = raw(server, "POST", "/v1/responses",
                          {"model": MODEL, "input": "Hi", "max_output_tokens": 3, "stream": True})
    events = sse_events(body)
    assert status == 200 and events[-1][0] == "response.incomplete"
    assert json.loads(events[-1][1])["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_engine_failure_mid_stream_is_response_failed(client, server, steer):
    steer.failing = True
    status, _, body = raw(server, "POST", "/v1/responses",
                          {"model": MODEL, "input": "Hi", "stream": True})
    name, data = sse_events(body)[-1]
    failed = json.loads(data)["response"]
    assert status == 200 and name == "response.failed" and failed["status"] == "failed"
    assert failed["error"]["code"] == "server_error" and "scripted failure" in failed["error"]["message"]
    with pytest.raises(openai.InternalServerError):
        create(client, input="Hi")


def test_reasoning_summary_and_sealed_reasoning(client, steer):
    steer.say("Private steps.</think>\n\n" + CALL, "Hm.</think>\n\ndone")
    with client.responses.stream(model=MODEL, input="Weather?", tools=[TOOL], store=False,
                                 reasoning={"summary": "auto"}, include=["reasoning.encrypted_content"]) as stream:
        kinds = {e.type for e in stream}
        first = stream.get_final_response()
    assert "response.reasoning_summary_text.delta" in kinds and "response.reasoning_text.delta" not in kinds
    reasoning, call = first.output
    assert [s.text for s in reasoning.summary] == ["Private steps."] and not reasoning.content
    # a client keeping no state sends the reasoning back sealed, without its text: it renders as before
    back = {"type": "reasoning", "id": reasoning.id, "summary": [], "encrypted_content": reasoning.encrypted_content}
    items = [{"role": "user", "content": "Weather?"}, back, call.model_dump(exclude_none=True),
             {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]
    r = create(client, input=items, tools=[TOOL])
    chat = [{"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "", "reasoning_content": "Private steps.",
             "tool_calls": [{"id": call.call_id, "type": "function",
                             "function": {"name": "get_weather", "arguments": call.arguments}}]},
            {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}]
    assert r.usage.input_tokens == chat_prompt_tokens(client, chat, tools=[CHAT_TOOL])


def test_output_text_logprobs(client, steer):
    steer.say("Hm.</think>\n\nYes, café.")
    r = create(client, input="Hi", include=["message.output_text.logprobs"], top_logprobs=2)
    lp = r.output[-1].content[0].logprobs
    assert "".join(t.token for t in lp) == "Yes, café." and all(len(t.top_logprobs) == 2 for t in lp)


def test_sampling_and_reasoning_effort_reach_the_engine(client, steer):
    steer.say("Plain.")
    r = create(client, input="Hi", temperature=0.3, top_p=0.9, reasoning={"effort": "none"})
    p = steer.seen[-1]
    assert (p.temperature, p.top_p) == (0.3, 0.9) and (r.temperature, r.top_p) == (0.3, 0.9)
    assert r.output_text == "Plain." and [o.type for o in r.output] == ["message"]


def test_text_format_takes_the_chat_response_format_path(client, server, steer):
    steer.say('{"a": 1}')
    for fmt, chat_fmt in (({"type": "json_object"}, {"type": "json_object"}),
                          ({"type": "json_schema", "name": "x", "schema": {"type": "object"}, "strict": True},
                           {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"},
                                                                   "strict": True}})):
        status, _, _ = raw(server, "POST", "/v1/chat/completions",
                           {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 20,
                            "response_format": chat_fmt, "reasoning_effort": "none"})
        rstatus, _, out = raw(server, "POST", "/v1/responses",
                              {"model": MODEL, "input": "x", "max_output_tokens": 20, "text": {"format": fmt},
                               "reasoning": {"effort": "none"}})
        assert rstatus == status, out
        if status == 400:
            assert json.loads(out)["error"]["param"] == "text.format"


@pytest.mark.parametrize("kw, param", [
    (dict(tools=[{"type": "web_search"}]), "tools.0.type"),
    (dict(tools=[{"type": "function", "name": "bad name"}]), "tools.0.name"),
    (dict(tool_choice="required"), "tool_choice"),
    (dict(tool_choice={"type": "allowed_tools", "mode": "auto", "tools": []}), "tool_choice"),
    (dict(background=True), "background"),
    (dict(truncation="auto"), "truncation"),
    (dict(include=["file_search_call.results"]), "include"),
    (dict(extra_body={"conversation": "conv_1"}), "conversation"),
    (dict(extra_body={"frobnicate": 1}), "frobnicate"),
    (dict(input=[{"type": "computer_call", "call_id": "c"}]), "input.0.type"),
    (dict(input=[{"type": "function_call", "name": "f", "arguments": "{}"}]), "input.0.call_id"),
    (dict(input=[{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{oops"}]), "input.0.arguments"),
    (dict(input=[{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]), "input.0.content.0"),
    (dict(input=[{"role": "wizard", "content": "hi"}]), "input.0.role"),
    (dict(input=[{"type": "reasoning", "summary": [], "encrypted_content": "gAAAA"}]), "input.0.encrypted_content"),
    (dict(input=[]), "input"),
    (dict(reasoning={"effort": "extreme"}), "reasoning.effort"),
    (dict(max_output_tokens=0), "max_output_tokens"),
    (dict(max_output_tokens=10 ** 6), "input"),
    (dict(metadata={"k" * 65: "v"}), "metadata"),
])
def test_bad_requests_are_400_with_the_openai_envelope(client, kw, param):
    kw.setdefault("input", "Hi")
    with pytest.raises(openai.BadRequestError) as e:
        create(client, **kw)
    err = e.value.body
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"], err


def test_images_take_the_chat_image_path(client):
    image = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}
    with pytest.raises(openai.BadRequestError, match="has no vision") as e:
        create(client, input=[{"role": "user", "content": [{"type": "input_text", "text": "what?"}, image]}])
    assert e.value.param == "input.0.content.1"


def test_unknown_model_and_response_ids(client, server):
    with pytest.raises(openai.NotFoundError):
        create(client, input="Hi", model="gpt-5")
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.retrieve("resp_nope")
    assert e.value.body["type"] == "invalid_request_error"
    status, _, _ = raw(server, "DELETE", "/v1/responses/resp_nope")
    assert status == 404


# ---- third-party clients -----------------------------------------------------------------------------
def test_openai_agents_runner_calls_the_tool_and_finishes(server, steer):
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    seen = []

    @agents.function_tool
    def get_weather(city: str, days: int) -> str:
        """Weather for a city."""
        seen.append((city, days))
        return "18 C, sunny"

    model = agents.OpenAIResponsesModel(model=MODEL, openai_client=openai.AsyncOpenAI(
        base_url=server.url + "/v1", api_key="unused", max_retries=0))
    agent = agents.Agent(name="weather", instructions="Answer with the tool.", tools=[get_weather], model=model,
                         model_settings=agents.ModelSettings(tool_choice="required", max_tokens=200))

    async def both():                   # one event loop: the client's connections belong to it
        steer.say("I need the weather.</think>\n\n" + CALL, "Hm.</think>\n\nIt is 18 C and sunny in Paris.")
        result = await agents.Runner.run(agent, "Weather in Paris?", max_turns=3)
        steer.say("I need the weather.</think>\n\n" + CALL, "Hm.</think>\n\nStreamed: sunny.")
        streamed = agents.Runner.run_streamed(agent, "Weather in Paris?", max_turns=3)
        events = [event.type async for event in streamed.stream_events()]
        return result, streamed, events

    result, streamed, events = asyncio.run(both())
    assert result.final_output == "It is 18 C and sunny in Paris."
    kinds = [item.type for item in result.new_items]
    assert "tool_call_item" in kinds and "tool_call_output_item" in kinds and kinds[-1] == "message_output_item"
    assert sum(r.usage.input_tokens for r in result.raw_responses) > 0
    assert streamed.final_output == "Streamed: sunny." and "raw_response_event" in events
    assert seen == [("Paris", 3)] * 2


def test_langchain_chat_openai_with_the_responses_api(server, steer):
    lc = pytest.importorskip("langchain_openai")
    steer.say("Hm.</think>\n\nBonjour.")
    llm = lc.ChatOpenAI(model=MODEL, base_url=server.url + "/v1", api_key="unused", use_responses_api=True,
                        max_retries=0, max_tokens=50)
    msg = llm.invoke("Say hello in French.")
    assert msg.text == "Bonjour." and msg.usage_metadata["output_tokens"] > 0
    steer.say("Hm.</think>\n\n" + CALL)
    msg = llm.bind_tools([CHAT_TOOL]).invoke("Weather in Paris?")
    assert [(c["name"], c["args"]) for c in msg.tool_calls] == [("get_weather", {"city": "Paris", "days": 3})]
