import os
import sys
import tempfile

import pytest
import torch

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# converted (int4) weights of test checkpoints go to a temporary cache, never the user's
os.environ.setdefault("QWENDESK_CACHE_DIR", tempfile.mkdtemp(prefix="qwendesk-cache-"))
if not torch.cuda.is_available():
    # Triton kernels run in the interpreter on the CPU; it must be set before any kernel is defined.
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # flash-linear-attention (a runtime dependency for GPU prefill) needs a GPU; without one,
    # transformers (the reference) must take its torch path instead of fla's kernels
    sys.modules["fla"] = None


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """checkpoint(name) -> path of a tiny random checkpoint (built once per session)."""
    from tests.fixtures.checkpoints import write_checkpoint

    built = {}

    def get(name: str = "base"):
        if name not in built:
            built[name] = write_checkpoint(tmp_path_factory.mktemp(name) / name, name)
        return built[name]

    return get


@pytest.fixture
def app_env(tmp_path, monkeypatch, qapp):
    """The GUI tests' environment (tests/app_support.py: prepare_app_env); PySide6 is imported only here."""
    from tests.app_support import prepare_app_env
    return prepare_app_env(tmp_path, monkeypatch, qapp)


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """Every tensor a kernel launcher allocates with torch.empty starts as NaN (or -1), so an element
    the kernel fails to write fails the test."""
    real = torch.empty

    def empty(*size, **kw):
        t = real(*size, **kw)
        return t.fill_(float("nan")) if t.is_floating_point() else t.fill_(-1)

    monkeypatch.setattr(torch, "empty", empty)


@pytest.fixture
def tiny_pools():
    """tiny_pools(num_pages, num_slots, page_size=4) -> a real CacheTensors on the CPU (one layer, one head of one
    element); state slot s starts out holding the value s, so a copy between slots shows."""
    from engine.cache.pages import CacheTensors

    def make(num_pages: int, num_slots: int, page_size: int = 4) -> CacheTensors:
        slots = torch.arange(num_slots, dtype=torch.float32)
        return CacheTensors(k=torch.zeros(1, num_pages, page_size, 1, 1), v=torch.zeros(1, num_pages, page_size, 1, 1),
                            k_scale=None, v_scale=None, conv=slots.view(1, num_slots, 1, 1).clone(),
                            ssm=slots.view(1, num_slots, 1, 1, 1).clone(), page_size=page_size)

    return make
