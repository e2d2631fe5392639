"""Issue 47, item 2: one memory figure, the engine's budget, on every page; on the CPU from the available RAM
(not half of the free pages), refreshed when it changes; a card that does not fit says what does not."""

import os
from pathlib import Path

from PySide6.QtWidgets import QLabel

from app.catalog import what_limits
from engine.api import DeviceInfo, EngineConfig, plan_for, probe
from tests.app_support import make_context, open_window, page_screenshot

GIB = 1 << 30
# the review's machine: 23.5 GiB of RAM, ~20 GiB available (most of it reclaimable cache, little of it free)
REVIEW_PC = DeviceInfo("cpu", "CPU", int(23.5 * GIB), 20 * GIB)


def test_the_cpu_offers_its_available_memory_not_half_the_free_pages():
    free_pages = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    device = probe("cpu")
    assert 0.6 * free_pages < device.free_bytes <= device.total_bytes
    budget = plan_for(EngineConfig(model=""), REVIEW_PC, model=small_model()).budget_bytes
    assert budget == 20 * GIB - int(23.5 * GIB) // 10          # a tenth of the RAM kept for the system


def small_model():
    from app.catalog import load_catalog

    return next(e.architecture for e in load_catalog() if e.id == "Qwen/Qwen3.5-0.8B")


def test_the_review_machine_runs_the_small_models_and_every_page_shows_one_figure(app_env, qtbot, checkpoint):
    path = str(checkpoint())
    context = make_context(app_env, device=REVIEW_PC, last_model=path)
    window = open_window(qtbot, context, autoload=False)
    small = next(c for c in window.models.cards if c.entry.id == "Qwen/Qwen3.5-0.8B")
    assert not small.too_large and "Runs as" in small.facts.text()
    text = window.models.recommendation.text()
    assert "download that runs as" in text and "gib" not in text
    figure = "17.7 GiB"
    assert window.models.machine_note.text().startswith(f"Models run on the CPU: slow, and only small models are "
                                                         f"practical. {figure} of memory for models")
    window.show_page("settings")
    assert f"with {figure} available" in window.settings_page.plans.note.text()
    page_screenshot(window.models, "memory_review_machine_models")
    page_screenshot(window.settings_page, "memory_review_machine_settings")


def test_the_figure_follows_the_machine(app_env, qtbot):
    readings = [DeviceInfo("cpu", "CPU", 32 * GIB, 3 * GIB), DeviceInfo("cpu", "CPU", 32 * GIB, 24 * GIB)]
    context = make_context(app_env, device=readings[0])
    context.probe = lambda: readings[-1]
    window = open_window(qtbot, context, autoload=False)
    window.refresh_memory()
    assert "20.8 GiB of memory for models" in window.models.machine_note.text()
    assert not next(c for c in window.models.cards if c.entry.id == "Qwen/Qwen3.5-2B").too_large


def test_a_model_too_large_says_what_does_not_fit():
    def limit(free_gib):
        plan = plan_for(EngineConfig(model=""), DeviceInfo("cpu", "CPU", 8 * GIB, free_gib * GIB), model=small_model())
        assert not plan.fits
        return what_limits(plan)

    assert limit(2) == "the weights alone take 2.8 GiB"                     # a budget of 1 GiB
    assert limit(4).startswith("weights 2.8 GiB and working memory")        # 3 GiB


def test_sizes_say_what_runs(app_env, qtbot, checkpoint):
    """Item 12: "Runs as 16-bit on the CPU" ran in fp32; small models showed "0.0 GiB of weights"."""
    path = str(checkpoint())
    window = open_window(qtbot, make_context(app_env, device=REVIEW_PC, model_folders=[str(Path(path).parent)]),
                         autoload=False)
    small = next(c for c in window.models.cards if c.entry.id == "Qwen/Qwen3.5-0.8B")
    assert "Runs as 32-bit on the CPU (2.8 GiB of weights)" in small.facts.text()
    (row,) = [r for r in window.models.local_rows if r.model.path == path]
    assert "Runs as 32-bit on the CPU (895 KiB of weights)" in row_text(row)
    page_screenshot(window.models, "models_sizes_on_the_cpu")


def row_text(row) -> str:
    return " ".join(label.text() for label in row.findChildren(QLabel))


def test_settings_say_what_does_not_fit(app_env, qtbot, checkpoint):
    """Each row that does not fit says which part (here the working memory beside the weights: 0.5 GiB to plan
    with)."""
    path = str(checkpoint())
    window = open_window(qtbot, make_context(app_env, device=DeviceInfo("cpu", "CPU", 4 * GIB, int(1.5 * GIB)),
                                             last_model=path), autoload=False)
    window.show_page("settings")
    table = window.settings_page.plans
    rows = [table.grid.itemAtPosition(r, 2).widget() for r in range(1, 5)]
    assert rows[-1].text() == "does not fit"
    assert rows[-1].toolTip().startswith("Does not fit: weights 895 KiB and working memory 518.1 MiB.")
