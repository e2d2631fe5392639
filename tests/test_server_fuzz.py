"""Schema fuzzing: hypothesis-generated bodies, plausible and junk, against every POST route.
Whatever comes in, the answer is never a 5xx, and it is either a success in the route's shape or an
error in the route's envelope."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.server_harness import MODEL, make_engine, raw, serving, sse_events

junk = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats() | st.text(max_size=12),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                    max_leaves=8)
text = st.text(max_size=40)


def obj(required=None, **optional):
    return st.fixed_dictionaries(dict(required or {}), optional=optional)


@st.composite
def one_junk_field(draw, bodies):
    """A plausible body, often with one of its fields (maybe a nested one) replaced by junk."""
    body = draw(bodies)
    node = body
    while draw(st.booleans()) and isinstance(node, dict) and node:
        key = draw(st.sampled_from(sorted(node)))
        if draw(st.booleans()) or not isinstance(node[key], (dict, list)) or not node[key]:
            node[key] = draw(junk)
            break
        node = node[key] if isinstance(node[key], dict) else node[key][0]
    return body


def mostly(valid, *rare):
    """Valid values, with a few of the invalid ones a client might really send."""
    return st.sampled_from([valid] * 9 + [st.sampled_from(rare)]).flatmap(lambda s: s) if rare else valid


count = mostly(st.integers(1, 5), 0, -1)
role = st.sampled_from(["user"] * 4 + ["system", "developer", "assistant", "tool"])
schema = st.sampled_from([{"type": "object", "properties": {"x": {"type": "integer"}}}, {}, {"type": "string"}])
openai_part = obj({"type": mostly(st.just("text"), "image_url", "input_audio", "file")}, text=text,
                  image_url=obj(url=text))
openai_call = obj({"function": obj({"name": mostly(st.sampled_from(["f", "g"]), "")},
                                   arguments=mostly(st.just('{"x": 1}'), "{bad", "[]", ""))}, id=text)
openai_message = obj({"role": role}, content=st.one_of(text, st.lists(openai_part, max_size=3), st.none()),
                     tool_calls=st.lists(openai_call, max_size=2), tool_call_id=text, reasoning_content=text)
openai_tool = obj({"type": st.just("function"),
                   "function": obj({"name": mostly(st.sampled_from(["f", "g"]), "bad name")}, parameters=schema)})
sampling = dict(temperature=mostly(st.floats(0, 2), -1, 3), top_p=mostly(st.floats(0.01, 1), 0, 1.5),
                top_k=mostly(st.integers(-1, 2 ** 31 - 1), 2 ** 40), min_p=st.floats(0, 1),
                presence_penalty=st.floats(-2, 2), frequency_penalty=st.floats(-2, 2),
                repetition_penalty=mostly(st.floats(0.5, 2), 0), seed=st.integers(-2 ** 63, 2 ** 64 - 1),
                stop=st.one_of(text, st.lists(text, max_size=3)), stop_token_ids=st.lists(st.integers(0, 10 ** 6),
                                                                                          max_size=3),
                n=mostly(st.just(1), 2), stream=st.booleans(), stream_options=obj(include_usage=st.booleans()),
                logit_bias=st.dictionaries(mostly(st.sampled_from(["1", "5", "600"]), "x", "99999999"),
                                           mostly(st.floats(-100, 100), 200)),
                ignore_eos=st.booleans(), max_tokens=count)
model = mostly(st.just(MODEL), "other")

chat_body = obj({"model": model, "messages": st.lists(openai_message, min_size=1, max_size=4)}, **sampling,
                max_completion_tokens=count, logprobs=st.booleans(), top_logprobs=st.integers(0, 20),
                tools=st.lists(openai_tool, max_size=2), tool_choice=st.one_of(
                    st.sampled_from(["none", "auto", "required"]), obj({"function": obj({"name": st.just("f")})})),
                parallel_tool_calls=st.booleans(), reasoning_effort=st.sampled_from(["none", "low", "high"]),
                thinking_token_budget=st.integers(0, 4), chat_template_kwargs=st.dictionaries(
                    mostly(st.sampled_from(["enable_thinking", "x"]), "tools"), junk),
                response_format=obj(type=mostly(st.just("text"), "json_object")))
prompt = st.one_of(st.text(min_size=1, max_size=40), st.lists(st.integers(0, 700), min_size=1, max_size=5),
                   st.lists(st.one_of(text, st.lists(st.integers(0, 5), min_size=1)), min_size=1, max_size=3))
completion_body = obj({"model": model, "prompt": prompt}, **sampling, echo=st.booleans(),
                      logprobs=st.integers(0, 20), best_of=mostly(st.just(1), 2), suffix=mostly(st.none(), "x"))
block = obj({"type": mostly(st.sampled_from(["text", "tool_use", "tool_result", "thinking"]), "image", "document")},
            text=text, id=text, name=st.sampled_from(["f", "g", None]),
            input=st.dictionaries(st.text(max_size=3), junk),
            tool_use_id=text, content=st.one_of(text, st.lists(obj({"type": st.just("text")}, text=text))),
            thinking=text, source=obj(type=st.just("base64"), data=text), is_error=st.booleans())
anthropic_message = obj({"role": st.sampled_from(["user", "user", "assistant"]),
                         "content": st.one_of(text, st.lists(block, max_size=3))})
anthropic_tool = obj({"name": mostly(st.sampled_from(["f", "g"]), "")}, input_schema=schema, description=text,
                     type=mostly(st.just("custom"), "web_search_20250305"))
messages_body = obj({"model": model, "messages": st.lists(anthropic_message, min_size=1, max_size=4),
                     "max_tokens": count},
                    system=st.one_of(text, st.lists(obj({"type": st.just("text")}, text=text), max_size=2)),
                    stop_sequences=st.lists(text, max_size=2), stream=st.booleans(),
                    temperature=mostly(st.floats(0, 1), 2), top_p=st.floats(0.01, 1), top_k=st.integers(0, 100),
                    tools=st.lists(anthropic_tool, max_size=2),
                    tool_choice=obj({"type": st.sampled_from(["auto", "any", "tool", "none"])},
                                    name=st.sampled_from(["f", "g", "h"]), disable_parallel_tool_use=st.booleans()),
                    thinking=obj({"type": st.sampled_from(["enabled", "disabled", "adaptive"])},
                                 budget_tokens=st.integers(0, 4), display=st.sampled_from(["omitted", "summarized"])),
                    output_config=obj(effort=st.sampled_from(["low", "max"])))

response_part = obj({"type": mostly(st.sampled_from(["input_text", "output_text"]), "input_image", "input_file",
                                    "refusal")}, text=text, image_url=text, refusal=text)
response_item = st.one_of(
    obj({"role": mostly(st.sampled_from(["user", "assistant", "developer"]), "tool")},
        content=st.one_of(text, st.lists(response_part, max_size=2)), type=st.just("message")),
    obj({"type": st.just("function_call"), "call_id": text, "name": st.sampled_from(["f", "g"]),
         "arguments": mostly(st.just('{"x": 1}'), "{bad", "[]")}),
    obj({"type": st.just("function_call_output"), "call_id": text},
        output=st.one_of(text, st.lists(response_part, max_size=2))),
    obj({"type": mostly(st.just("reasoning"), "computer_call", "item_reference")},
        summary=st.lists(obj(type=st.just("summary_text"), text=text), max_size=1),
        content=st.lists(obj(type=st.just("reasoning_text"), text=text), max_size=1),
        encrypted_content=text))
response_tool = obj({"type": mostly(st.just("function"), "web_search", "custom"),
                     "name": mostly(st.sampled_from(["f", "g"]), "bad name")}, parameters=schema, strict=st.booleans())
responses_body = obj({"model": model}, input=st.one_of(text, st.lists(response_item, max_size=4)),
                     instructions=text, tools=st.lists(response_tool, max_size=2),
                     tool_choice=st.one_of(st.sampled_from(["none", "auto", "required"]),
                                           obj({"type": st.sampled_from(["function", "allowed_tools"]),
                                                "name": st.just("f")})),
                     reasoning=obj(effort=st.sampled_from(["none", "low", "high"]),
                                   summary=st.sampled_from(["auto", "detailed"])),
                     text=obj(format=obj(type=mostly(st.just("text"), "json_object", "json_schema"))),
                     include=st.lists(mostly(st.sampled_from(["reasoning.encrypted_content",
                                                              "message.output_text.logprobs"]), "x"), max_size=2),
                     max_output_tokens=count, temperature=mostly(st.floats(0, 2), 3), top_logprobs=st.integers(0, 20),
                     stream=st.booleans(), store=st.booleans(), previous_response_id=mostly(st.none(), "resp_x"),
                     parallel_tool_calls=st.booleans(), metadata=st.dictionaries(text, text, max_size=2),
                     truncation=mostly(st.just("disabled"), "auto"), background=mostly(st.just(False), True))

ROUTES = [("/v1/chat/completions", chat_body, "openai"), ("/v1/completions", completion_body, "openai"),
          ("/v1/responses", responses_body, "openai"),
          ("/v1/messages", messages_body, "anthropic"), ("/v1/messages/count_tokens", messages_body, "anthropic")]


@pytest.fixture(scope="module")
def server(checkpoint):
    engine = make_engine(checkpoint("base"), profile="C2", max_context=512)

    def short(params):  # bounded work per example, whatever max_tokens the body asked for
        params.max_tokens = min(params.max_tokens, 3)

    with serving(engine, short) as s:
        yield s
    engine.close()


def check(server, path, body, api):
    status, headers, out = raw(server, "POST", path, body)
    assert status < 500, (status, out)
    if status >= 400:
        err = json.loads(out)
        assert (err["type"] == "error" and err["error"]["message"]) if api == "anthropic" else err["error"]["message"]
    elif headers["content-type"].startswith("text/event-stream"):
        for name, data in sse_events(out):
            assert name not in ("error", "response.failed"), data
            assert data == "[DONE]" or "error" not in json.loads(data), data
    else:
        json.loads(out)


@pytest.mark.parametrize("path, strategy, api", ROUTES, ids=[r[0] for r in ROUTES])
def test_no_5xx(server, path, strategy, api):
    @settings(max_examples=100, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(body=one_junk_field(strategy))
    def run(body):
        check(server, path, body, api)

    run()


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(body=junk, path=st.sampled_from([r[0] for r in ROUTES]))
def test_junk_bodies_are_400(server, body, path):
    status, _, _ = raw(server, "POST", path, body)
    assert status in (400, 404)
