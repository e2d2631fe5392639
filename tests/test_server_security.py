"""The endpoint against a hostile web page: the browser's "simple" requests (text/plain or form bodies,
no preflight) and any request from an origin not allowed are refused before anything runs; path
tricks do not dodge the API key; preflights answer as the requests they announce would."""

import json

import pytest

from tests.server_harness import MODEL, engine, raw, reset, server, serving, steer  # noqa: F401 (fixtures)

USER = [{"role": "user", "content": "Hello"}]
BODY = json.dumps({"model": MODEL, "messages": USER, "max_tokens": 20}).encode()
ANTHROPIC = json.dumps({"model": MODEL, "messages": USER, "max_tokens": 20}).encode()
EVIL = "http://evil.example"


def nothing_ran(engine, steer, before: dict) -> bool:
    """No request reached the engine: none submitted (the params hook runs just before submit), none
    running or queued, the prefix cache untouched."""
    after = engine.stats()
    return (steer.seen == [] and after["running"] == after["waiting"] == 0
            and after["prefix_hit_tokens"] == before["prefix_hit_tokens"]
            and after["kv_pages_cached"] == before["kv_pages_cached"])


@pytest.mark.parametrize("path,body", [("/v1/chat/completions", BODY), ("/v1/messages", ANTHROPIC)])
def test_a_pages_simple_post_runs_nothing(engine, server, steer, path, body):
    before = engine.stats()
    # what fetch(url, {method: "POST", body: JSON.stringify(...)}) sends: text/plain, the page's Origin
    status, _, out = raw(server, "POST", path, body, headers={"content-type": "text/plain;charset=UTF-8",
                                                               "origin": EVIL})
    assert status == 403
    error = json.loads(out)["error"]
    assert error["type"] == "permission_error" and EVIL in error["message"]
    # the same without Origin (a page cannot do that, but a form can be made to look so): 415
    status, _, out = raw(server, "POST", path, body, headers={"content-type": "text/plain"})
    assert status == 415 and "application/json" in json.loads(out)["error"]["message"]
    # an HTML form's encodings
    for ctype in ("application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        assert raw(server, "POST", path, body, headers={"content-type": ctype})[0] == 415
    assert nothing_ran(engine, steer, before)


def test_content_type_must_be_json(engine, server, steer):
    before = engine.stats()
    for headers in ({"content-type": ""}, {"content-type": "application/jsonx"},
                    {"content-type": "application/json; charset=latin-1"}, {"content-type": "text/json"}):
        status, _, out = raw(server, "POST", "/v1/chat/completions", BODY, headers=headers)
        assert status == 415, headers
        assert json.loads(out)["error"]["code"] == "unsupported_media_type"
    status, _, out = raw(server, "POST", "/v1/messages", ANTHROPIC, headers={"content-type": "text/plain"})
    assert status == 415 and json.loads(out)["type"] == "error"            # the Anthropic envelope
    assert nothing_ran(engine, steer, before)


def test_missing_content_type_is_415(engine, server, steer):
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.putrequest("POST", "/v1/chat/completions")
    conn.putheader("content-length", str(len(BODY)))
    conn.endheaders(BODY)
    resp = conn.getresponse()
    assert resp.status == 415 and "no Content-Type" in json.loads(resp.read())["error"]["message"]
    conn.close()
    assert steer.seen == []


@pytest.mark.parametrize("ctype", ["application/json", "Application/JSON; Charset=UTF-8",
                                   'application/json;charset="utf-8"'])
def test_json_content_types_are_accepted(server, steer, ctype):
    steer.say("Hm.</think>\n\nok")
    status, _, out = raw(server, "POST", "/v1/chat/completions", BODY, headers={"content-type": ctype})
    assert status == 200 and json.loads(out)["choices"][0]["message"]["content"] == "ok"


def test_foreign_origin_is_refused_everywhere(engine, server, steer):
    before = engine.stats()
    for method, path in (("GET", "/v1/models"), ("GET", "/metrics"), ("GET", "/health"),
                         ("POST", "/v1/chat/completions"), ("POST", "/v1/messages/count_tokens")):
        for origin in (EVIL, "null", f"http://127.0.0.1:{server.port}"):   # null: sandboxed frames, file://
            status, headers, _ = raw(server, method, path, BODY if method == "POST" else None,
                                     headers={"origin": origin})
            assert status == 403, (method, path, origin)
            assert "access-control-allow-origin" not in headers
    preflight = {"origin": EVIL, "access-control-request-method": "POST",
                 "access-control-request-headers": "content-type"}
    status, headers, _ = raw(server, "OPTIONS", "/v1/chat/completions", headers=preflight)
    assert status == 403 and "access-control-allow-origin" not in headers
    assert nothing_ran(engine, steer, before)


def test_allowed_origin_works(engine, steer):
    app_origin = "http://app.local:3000"
    with serving(engine, steer, cors_origins=["HTTP://App.Local:3000/"]) as srv:
        preflight = {"origin": app_origin, "access-control-request-method": "POST",
                     "access-control-request-headers": "content-type, authorization"}
        status, headers, _ = raw(srv, "OPTIONS", "/v1/chat/completions", headers=preflight)
        assert status == 200 and headers["access-control-allow-origin"] == app_origin
        steer.say("Hm.</think>\n\nok")
        status, headers, out = raw(srv, "POST", "/v1/chat/completions", BODY, headers={"origin": app_origin})
        assert status == 200 and headers["access-control-allow-origin"] == app_origin
        assert json.loads(out)["choices"][0]["message"]["content"] == "ok"
        status, _, _ = raw(srv, "POST", "/v1/chat/completions", BODY,       # still JSON only
                           headers={"origin": app_origin, "content-type": "text/plain"})
        assert status == 415
        assert raw(srv, "GET", "/v1/models", headers={"origin": EVIL})[0] == 403


def test_path_tricks_do_not_dodge_the_key(engine, steer):
    with serving(engine, steer, api_key="sekret") as srv:
        for method, path in (("POST", "//v1/chat/completions"), ("POST", "/v1/chat/completions/"),
                             ("POST", "/v1/%2e%2e/v1/chat/completions"), ("GET", "/metrics/"), ("GET", "//metrics"),
                             ("HEAD", "/v1/models"), ("GET", "/openapi.json"), ("GET", "/nope")):
            status, _, _ = raw(srv, method, path, BODY if method == "POST" else None)
            assert status == 401, (method, path, status)
        assert raw(srv, "GET", "/health")[0] == 200
        assert raw(srv, "HEAD", "/v1/models", headers={"x-api-key": "sekret"})[0] == 405   # GET only
        key = {"authorization": "Bearer sekret"}
        for path in ("//v1/chat/completions", "/v1/%2e%2e/v1/chat/completions", "/v1/./chat/completions"):
            assert raw(srv, "POST", path, BODY, headers=key)[0] == 404, path
    assert steer.seen == []
