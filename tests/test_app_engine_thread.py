"""The engine thread serves its commands while a reply streams: a second reply streams beside the first, and an
unload ends the reply at once (the reply's events come from the engine's own thread, not from this one's loop)."""

import pytest

from app.engine_thread import EngineThread
from app.load_state import Phase
from engine.api import EngineConfig, SamplingParams

ENDLESS = SamplingParams(max_tokens=4000, temperature=0.0, ignore_eos=True)     # far longer than either test waits


@pytest.fixture
def thread(qtbot, checkpoint):
    thread = EngineThread()
    thread.load(EngineConfig(model=str(checkpoint("base")), device="cpu", profile="C2", max_context=4096))
    qtbot.waitUntil(lambda: thread.state.phase is Phase.LOADED, timeout=60_000)
    yield thread
    assert thread.shutdown()


def record(thread):
    """{request id: delta count} and {request id: finish reason}, filled as the signals come."""
    deltas, finished = {}, {}
    thread.delta.connect(lambda request_id, *_: deltas.__setitem__(request_id, deltas.get(request_id, 0) + 1))
    thread.reply_finished.connect(lambda request_id, result: finished.__setitem__(request_id, result.finish_reason))
    return deltas, finished


def test_a_second_reply_streams_while_the_first_does(thread, qtbot):
    deltas, finished = record(thread)
    thread.generate("long", [{"role": "user", "content": "Go on."}], ENDLESS, {})
    qtbot.waitUntil(lambda: deltas.get("long", 0) >= 2, timeout=30_000)
    thread.generate("short", [{"role": "user", "content": "Hi."}], SamplingParams(max_tokens=3, ignore_eos=True), {})
    qtbot.waitUntil(lambda: "short" in finished, timeout=30_000)
    assert finished == {"short": "length"} and deltas["short"] == 3     # the long one still streams
    thread.cancel("long")
    qtbot.waitUntil(lambda: "long" in finished, timeout=10_000)
    assert finished["long"] == "cancelled"


def test_an_unload_ends_a_streaming_reply_at_once(thread, qtbot):
    deltas, finished = record(thread)
    thread.generate("long", [{"role": "user", "content": "Go on."}], ENDLESS, {})
    qtbot.waitUntil(lambda: deltas.get("long", 0) >= 2, timeout=30_000)
    thread.unload()
    qtbot.waitUntil(lambda: thread.state.phase is Phase.UNLOADED, timeout=10_000)
    qtbot.waitUntil(lambda: "long" in finished, timeout=10_000)
    assert finished == {"long": "cancelled"} and thread.model is None
    with qtbot.waitSignal(thread.reply_finished, timeout=10_000) as after:
        thread.generate("next", [{"role": "user", "content": "Hi."}], SamplingParams(max_tokens=3), {})
    assert after.args[0] == "next" and after.args[1].error == "No model is loaded."
