"""engine/core/collector.py: a loaded engine's objects are out of the garbage collector's walks (a full collection
over them paused every stream for 100-330 ms on an H200), and given back to it when the engine closes."""

import gc
import weakref

import pytest

from engine.api import Engine, EngineConfig, SamplingParams, freeze_long_lived


class Node:
    pass


def cycle():
    """Two objects that only a collection frees, and a weak reference that says whether it did."""
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a), a


def tracked(obj) -> bool:
    """The collector walks obj in its full collections (frozen objects are not among gc.get_objects())."""
    return any(o is obj for o in gc.get_objects())


@pytest.fixture(autouse=True)
def unfrozen():
    yield
    gc.unfreeze()


def test_a_freeze_keeps_the_survivors_out_and_lets_an_earlier_freezes_go():
    gone, a = cycle()
    freeze_long_lived()
    assert gc.get_freeze_count() > 0 and not tracked(a)
    del a
    gc.collect()
    assert gone() is not None                     # frozen: a collection does not see the garbage
    freeze_long_lived()                           # the next freeze (another load) unfreezes and collects first
    assert gone() is None


@pytest.fixture(scope="module")
def ckpt(checkpoint):
    return str(checkpoint("gqa3_ratio3"))


def test_an_engine_freezes_what_it_loaded_and_releases_it_at_close(ckpt):
    gc.unfreeze()
    eng = Engine(EngineConfig(model=ckpt, device="cpu", dtype="float32", max_context=256))
    try:
        assert gc.get_freeze_count() > 0 and not tracked(eng._loop) and not tracked(eng._model)
        out = eng.generate(list(range(1, 20)), SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
        assert len(out.token_ids) == 4                # it serves as before
    finally:
        eng.close()
    assert gc.get_freeze_count() == 0 and tracked(eng._loop)


def test_an_engine_told_not_to_leaves_the_collector_alone(ckpt):
    gc.unfreeze()
    gone = cycle()[0]                             # garbage now: only a collection frees it
    gc.disable()                                  # as the app keeps it: no automatic collection
    try:
        eng = Engine(EngineConfig(model=ckpt, device="cpu", dtype="float32", max_context=256), freeze_gc=False)
        assert gc.get_freeze_count() == 0 and tracked(eng._loop)
        assert gone() is not None                 # no collection ran in the load's thread (the app's engine thread)
        eng.close()
        assert gone() is not None
    finally:
        gc.enable()


def test_an_engine_collects_once_at_the_end_of_its_load(ckpt):
    gc.unfreeze()
    gone = cycle()[0]
    gc.disable()
    try:
        eng = Engine(EngineConfig(model=ckpt, device="cpu", dtype="float32", max_context=256))
        assert gone() is None                     # collected before the freeze, not kept for good
        eng.close()
    finally:
        gc.enable()

