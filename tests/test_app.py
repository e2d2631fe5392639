from pathlib import Path

from app.main import MainWindow

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"


def test_main_window_opens_on_models_page(qtbot):
    w = MainWindow()
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    assert w.windowTitle() == "Qwen Desk"
    assert w.nav.currentItem().text() == "Models"
    ARTIFACTS.mkdir(exist_ok=True)
    assert w.grab().save(str(ARTIFACTS / "main_window.png"))
