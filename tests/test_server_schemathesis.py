"""schemathesis over the served /openapi.json: requests generated from the documented request models
(valid bodies and broken ones) against a real server around a tiny random model. Whatever comes in, no
5xx. Kept short: a bounded number of examples per operation, replies capped at two tokens."""

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from tests.server_harness import make_engine, serving

EXAMPLES = 20          # per operation (the soak's run: SOAK_EXAMPLES, over 2,000 cases in all)
SOAK_EXAMPLES = 200


def two_tokens(params):
    params.max_tokens = min(params.max_tokens, 2)


@pytest.fixture(scope="module")
def api(checkpoint):
    engine = make_engine(checkpoint("base"), profile="C2", max_context=512)
    with serving(engine, two_tokens) as server:
        yield schemathesis.openapi.from_url(server.url + "/openapi.json")
    engine.close()


def test_the_documented_bodies(api):
    bodies = {op.ok().path: op.ok().body for op in api.get_all_operations() if op.ok().method == "post"}
    assert set(bodies) == {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
                           "/v1/messages/count_tokens", "/tokenize", "/detokenize"}
    assert all(len(b) == 1 and b[0].media_type == "application/json" for b in bodies.values())


def test_no_server_errors(api):
    no_server_errors(api, EXAMPLES)


@pytest.mark.soak
def test_no_server_errors_in_2000_cases(api):
    no_server_errors(api, SOAK_EXAMPLES)


def no_server_errors(api, examples: int):
    for result in api.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def no_5xx(case):
            case.call_and_validate(checks=[not_a_server_error])

        no_5xx()
