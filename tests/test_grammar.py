"""Grammar-constrained decoding on the CPU: a tiny random checkpoint (real-format Qwen tokenizer, trained here)
sampled at temperature 1, so that the model goes wherever the grammar lets it. Generated JSON Schemas: every reply
parses and validates; forced tool calls: every call parses and validates against its tool's schema."""

import json
import re

import jsonschema
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.api import Constraint, Engine, EngineConfig, SamplingParams
from tests.server_harness import wait_idle

# bounded schemas: a random model ends a string or an array by reaching its bound
NAMES = st.sampled_from(["a", "b", "name", "x_1", "value", "città"])
WORDS = st.text("abcxyz é", min_size=0, max_size=4)
LEAVES = st.one_of(
    st.builds(lambda lo, n: {"type": "string", "minLength": lo, "maxLength": lo + n},
              st.integers(0, 2), st.integers(0, 4)),
    st.just({"type": "integer"}),
    st.builds(lambda lo, n: {"type": "integer", "minimum": lo, "maximum": lo + n},
              st.integers(-50, 50), st.integers(0, 100)),
    st.just({"type": "number"}),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.builds(lambda v: {"enum": v}, st.lists(st.one_of(WORDS, st.integers(-3, 3), st.booleans(), st.none()),
                                               min_size=1, max_size=4, unique_by=json.dumps)),
    st.builds(lambda v: {"const": v}, WORDS),
    st.just({"type": ["integer", "null"]}),
    st.just({"type": "string", "pattern": "^[a-c]{1,3}-[0-9]$"}),
)


def objects(children):
    def build(props, required_flags):
        names = list(props)
        return {"type": "object", "properties": props, "additionalProperties": False,
                "required": [n for n, r in zip(names, required_flags) if r]}
    return st.dictionaries(NAMES, children, max_size=3).flatmap(
        lambda props: st.lists(st.booleans(), min_size=len(props), max_size=len(props)).map(
            lambda flags: build(props, flags)))


def arrays(children):
    return st.builds(lambda items, lo, n: {"type": "array", "items": items, "minItems": lo, "maxItems": lo + n},
                     children, st.integers(0, 1), st.integers(0, 2))


SCHEMAS = st.recursive(LEAVES, lambda children: st.one_of(
    objects(children), arrays(children),
    st.builds(lambda a, b: {"anyOf": [a, b]}, children, children)), max_leaves=6)


@pytest.fixture(scope="module")
def eng(checkpoint):
    e = Engine(EngineConfig(model=str(checkpoint("base")), device="cpu", dtype="float32", max_context=1024,
                            page_size=16, profile="C8", max_queue=512))
    yield e
    e.close()


def run_all(eng, requests):
    """Submit (prompt, params, tools) all at once (eight decode together), wait for every result."""
    handles = [eng.submit(p, params, tools=tools) for p, params, tools in requests]
    outs = []
    for handle in handles:
        text, calls, finish = "", {}, None
        for ev in handle:
            text += ev.text
            for piece in ev.pieces:
                if hasattr(piece, "name"):
                    calls[piece.index] = [piece.name, ""]
                elif hasattr(piece, "index"):
                    calls[piece.index][1] += piece.text
            finish = ev.finish_reason or finish
        outs.append((text, list(calls.values()), finish))
    return outs


@settings(max_examples=1, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(SCHEMAS, min_size=200, max_size=200))
def test_generated_schemas_always_parse_and_validate(eng, schemas):
    requests = [([1 + i % 7, 2, 3], SamplingParams(max_tokens=400, temperature=1.0, seed=i,
                                                    constraint=Constraint(json_schema=s)), None)
                for i, s in enumerate(schemas)]
    for schema, (text, _, finish) in zip(schemas, run_all(eng, requests)):
        assert finish == "stop", (schema, text)
        jsonschema.validate(json.loads(text), schema)


TOOL_PARAMS = st.one_of(LEAVES, objects(LEAVES), arrays(LEAVES), st.just({}), st.just({"description": "free text"}))


def tool_sets():
    def tool(i, props, flags):
        return {"type": "function", "function": {"name": f"tool_{i}", "parameters": {
            "type": "object", "properties": props,
            "required": [n for n, r in zip(props, flags) if r]}}}
    one = st.tuples(st.dictionaries(NAMES, TOOL_PARAMS, max_size=3), st.lists(st.booleans(), min_size=3, max_size=3))
    return st.lists(one, min_size=1, max_size=3).map(lambda ts: [tool(i, p, f) for i, (p, f) in enumerate(ts)])


@settings(max_examples=1, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(tool_sets(), st.booleans(), st.booleans()), min_size=60, max_size=60))
def test_forced_tool_calls_always_parse_and_validate(eng, cases):
    requests = []
    for i, (tools, named, parallel) in enumerate(cases):
        name = tools[-1]["function"]["name"] if named else None
        c = Constraint(tools=tools, tool_mode="required", tool_name=name, parallel=parallel)
        requests.append(([{"role": "user", "content": "call"}], SamplingParams(
            max_tokens=400, temperature=1.0, seed=i, constraint=c), tools))
    for j, (text, calls, finish) in enumerate(run_all(eng, [(
            eng.encode_prompt(p, tools=t, enable_thinking=False), params, t) for p, params, t in requests])):
        tools, named, parallel = cases[j]
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
        assert finish == "tool_calls" and text == "" and calls, (tools, text, calls)
        assert len(calls) == 1 or (parallel and not named)
        for name, args in calls:
            assert name in schemas and (not named or name == tools[-1]["function"]["name"])
            jsonschema.validate(json.loads(args), schemas[name])


SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
          "required": ["ok", "n"], "additionalProperties": False}


def test_thinking_stays_free_and_its_budget_holds(eng):
    """The prompt opens the thinking: it runs unconstrained until the budget closes it, then the reply is JSON."""
    for seed in range(4):
        out = eng.generate([{"role": "user", "content": "hi"}], SamplingParams(
            max_tokens=300, temperature=1.0, seed=seed, thinking_budget=12, constraint=Constraint(json_schema=SCHEMA)))
        assert out.usage.reasoning_tokens <= 12 + 1 and out.finish_reason == "stop"    # + the line break it forces
        jsonschema.validate(json.loads(out.text), SCHEMA)


def test_host_sampling_and_the_step_in_flight_agree(eng):
    """A seeded constrained request draws the same tokens whether the host samples (a logits processor) or the
    device does with the next step in flight (the masks then wait for the token in flight)."""
    def noop(output, logits):
        return logits
    for seed in range(3):
        plain = eng.generate([5, 6, 7], SamplingParams(max_tokens=200, temperature=1.0, seed=seed,
                                                       constraint=Constraint(json_schema=SCHEMA)))
        host = eng.generate([5, 6, 7], SamplingParams(max_tokens=200, temperature=1.0, seed=seed,
                                                      constraint=Constraint(json_schema=SCHEMA),
                                                      logits_processors=[noop]))
        assert plain.token_ids == host.token_ids and plain.finish_reason == "stop"


def test_json_object(eng):
    """Any JSON object: keys and strings end soon when the closing tokens are favoured (a logits processor)."""
    tok = eng.tokenizer
    closing = [t for t in range(tok.vocab_size) if (tok.decode([t]) or "x") in ('"', '}', ']', '"}', '"]')]

    def favour(output, logits):
        logits[closing] += 4.0
        return logits
    for seed in range(4):
        params = SamplingParams(max_tokens=300, temperature=1.0, seed=seed, logits_processors=[favour],
                                constraint=Constraint(json_schema={"type": "object"}))
        out = eng.generate([9, 9], params)
        assert out.finish_reason == "stop" and isinstance(json.loads(out.text), dict)


def test_a_text_parameters_pattern_is_enforced_in_tool_calls(eng):
    """pydantic's Field(pattern=...) on a string parameter: the call's raw-text value matches it (anchored or not)."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "code": {"type": "string", "pattern": "^[A-C]{2}-[0-9]{3}$"},
        "tag": {"type": "string", "pattern": "^v[0-9]/[0-9]$"}},
        "required": ["code", "tag"]}}}]
    for seed in range(3):
        out = eng.generate([{"role": "user", "content": "x"}], SamplingParams(
            max_tokens=300, temperature=1.0, seed=seed, constraint=Constraint(tools=tools, tool_mode="required")),
            tools=tools, enable_thinking=False)
        args = json.loads(out.tool_calls[0].arguments)
        assert re.fullmatch("[A-C]{2}-[0-9]{3}", args["code"]) and re.fullmatch("v[0-9]/[0-9]", args["tag"]), args
    wait_idle(eng)              # (generate returns on the finish event, a moment before the engine counts it done)


def test_auto_tool_choice_constrains_a_call_once_opened(eng):
    """tool_choice auto: free text, but a call the model opens is made under the grammar (forced open here)."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"]}}}]
    call_open = eng.tokenizer.token_to_id("<tool_call>")

    def opens(output, logits):
        if not output:
            logits[:] = float("-inf")
            logits[call_open] = 0.0
        return logits
    out = eng.generate([{"role": "user", "content": "x"}], SamplingParams(
        max_tokens=200, temperature=1.0, seed=1, logits_processors=[opens],
        constraint=Constraint(tools=tools)), tools=tools, enable_thinking=False)
    assert out.finish_reason == "tool_calls" and out.tool_calls[0].name == "f"
    assert isinstance(json.loads(out.tool_calls[0].arguments)["k"], int)


@pytest.mark.parametrize("constraint, words", [
    (Constraint(json_schema={"type": "strin"}), "Invalid type: strin"),
    (Constraint(json_schema={"type": "string", "pattern": "(("}), "unclosed group"),
    (Constraint(json_schema={"not": {"type": "string"}}), "not"),
    (Constraint(json_schema={"$ref": "#/$defs/missing"}), "does not exist"),
    (Constraint(tools=[{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "contentEncoding": "base64"}}}}}],
        tool_mode="required"), "'contentEncoding' cannot be enforced"),
    (Constraint(tools=[{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "pattern": "^((a{1000}){1000}){1000}$"}}}}}]),
     "tool 'f': pattern '^((a{1000}){1000}){1000}$' at properties.x repeats too much"),
    (Constraint(json_schema={"type": "object", "properties": {"x": {"type": "array", "items": {
        "type": "string", "pattern": "(b{300}){300}"}}}}), "at properties.x.items repeats too much"),
    (Constraint(tools=[{"type": "function", "function": {"name": "f", "parameters": {
        "anyOf": [{"type": "object"}]}}}]), "'anyOf'"),
    (Constraint(tools=[{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "integr"}}}}}]), "Invalid type: integr"),
    (Constraint(tools=[{"type": "function", "function": {"name": "f"}}], tool_mode="required", tool_name="g"),
     "not one of the tools"),
])
def test_bad_constraints_are_refused_at_submit(eng, constraint, words):
    with pytest.raises(ValueError) as e:
        eng.submit([1, 2], SamplingParams(constraint=constraint))
    assert words in str(e.value) and "\n" not in str(e.value)
    assert wait_idle(eng)["running"] == 0      # (a test before may have just finished)


def test_stats_stop_counting_a_request_once_its_finish_is_out(eng):
    """stats() agrees with the event stream: when generate() has returned (its finish event is out), the request is no
    longer counted as running and its pages are back (the refused-constraint test above counts on it)."""
    for seed in range(20):
        out = eng.generate([3, 4, 5], SamplingParams(max_tokens=4 + seed % 3, temperature=1.0, seed=seed))
        s = eng.stats()
        assert out.finish_reason in ("stop", "length") and (s["running"], s["waiting"]) == (0, 0), s


def test_masks_match_the_reference_bit_layout(eng):
    """Grammars.masks writes llguidance's layout: bit t % 32 of word t // 32; a row without a grammar is all ones."""
    grammars = eng._grammars
    m = grammars.matcher(Constraint(json_schema={"type": "boolean"}), in_reasoning=False)
    mask = grammars.masks([None, m])
    assert mask.shape == (2, grammars.words) and bool((mask[0] == -1).all())
    allowed = [t for t in range(eng.tokenizer.vocab_size) if (int(mask[1, t // 32]) >> (t % 32)) & 1]
    texts = {eng.tokenizer.decode([t]) for t in allowed}
    assert texts and all("true".startswith(x) or "false".startswith(x) for x in texts), texts
    assert mask.dtype == torch.int32


def test_model_rows_past_the_tokenizer_are_never_allowed(eng):
    """Qwen's LM head has more rows (248,320) than its tokenizer has tokens (248,077): those never pass a mask."""
    from engine.text.grammar import Grammars
    n = eng.tokenizer.vocab_size
    grammars = Grammars(eng.tokenizer, n + 100)
    mask = grammars.masks([grammars.matcher(Constraint(json_schema={"type": "string"}), in_reasoning=False)])
    allowed = [t for t in range(n + 100) if (int(mask[0, t // 32]) >> (t % 32)) & 1]
    assert allowed and max(allowed) < n
