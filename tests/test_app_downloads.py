"""Downloads against a fake hub on loopback that serves the tiny checkpoint: progress, resume
after a cut connection and after a restart, sha256 checks, cancel, disk-full refusal, stalls."""

import hashlib
from pathlib import Path

import pytest

from app.downloads import DownloadManager
from app.local_models import scan_downloads
from app.store import Store
from tests.app_support import (
    FakeHub,
    make_context,
    open_window,
    screenshot,
)


REPO = "Qwen/Qwen3.5-Tiny"
WEIGHTS = "model.safetensors"


@pytest.fixture
def hub(checkpoint):
    server = FakeHub({REPO: Path(checkpoint("base"))})
    yield server
    server.stop()


def manager(tmp_path, hub, **kwargs) -> DownloadManager:
    store = Store(tmp_path / "data" / "qwendesk.sqlite3")
    kwargs = {"chunk_size": 8192, "stall_after_s": 5.0, **kwargs}
    return DownloadManager(store, tmp_path / "data" / "models", endpoint=hub.url, **kwargs)


def wait_state(qtbot, m, state, timeout=20_000):
    qtbot.waitUntil(lambda: (m.status(REPO) or type("s", (), {"state": None})).state == state, timeout=timeout)


def files_match(hub, folder: Path) -> bool:
    return all(hashlib.sha256((folder / name).read_bytes()).digest() == hashlib.sha256(data).digest()
               for name, data in hub.repos[REPO].items())


def test_download_reports_progress_and_verifies(app_env, qtbot, hub):
    hub.delay = 0.004                                        # ~1 MB/s: progress over a dozen ticks
    m = manager(app_env, hub)
    progress = []
    m.changed.connect(lambda repo: progress.append(m.status(repo).done_bytes))
    with qtbot.waitSignal(m.completed, timeout=20_000) as done:
        m.start(REPO)
    repo, folder = done.args
    assert repo == REPO and files_match(hub, Path(folder))
    total = sum(len(d) for d in hub.repos[REPO].values())
    assert progress == sorted(progress) and progress[-1] == total and len(set(progress)) > 5
    assert m.status(REPO).state == "ready"
    assert [model.name for model in scan_downloads(app_env / "data" / "models")] == [REPO]
    assert not list(Path(folder).rglob("*.part"))
    assert m.store.downloads() == {}


def test_cut_connection_resumes_from_the_partial_file(app_env, qtbot, hub):
    hub.cut_after[WEIGHTS] = 300_000
    m = manager(app_env, hub)
    states = []
    m.changed.connect(lambda repo: states.append(m.status(repo).state))
    with qtbot.waitSignal(m.completed, timeout=30_000) as done:
        m.start(REPO)
    assert "stalled" in states                              # the retry is visible
    assert hub.file_gets(WEIGHTS) == [None, "bytes=300000-"]
    assert files_match(hub, Path(done.args[1]))


def test_pause_survives_a_restart_and_resumes(app_env, qtbot, hub):
    hub.delay = 0.005
    first = manager(app_env, hub)
    first.start(REPO)
    qtbot.waitUntil(lambda: first.status(REPO).done_bytes > 100_000, timeout=20_000)
    first.pause(REPO)
    wait_state(qtbot, first, "paused")
    paused_at = first.status(REPO).done_bytes
    part = app_env / "data" / "models" / "Qwen" / "Qwen3.5-Tiny" / f"{WEIGHTS}.part"
    assert part.is_file() and part.stat().st_size > 0
    first.shutdown()
    first.store.close()

    hub.delay = 0.0
    second = manager(app_env, hub)                          # the app started again
    status = second.status(REPO)
    assert status.state == "paused" and status.done_bytes == paused_at
    with qtbot.waitSignal(second.completed, timeout=20_000) as done:
        second.resume(REPO)
    assert hub.file_gets(WEIGHTS)[-1] == f"bytes={part_size_before(paused_at, hub)}-"
    assert files_match(hub, Path(done.args[1]))


def part_size_before(done_bytes: int, hub) -> int:
    """Bytes of the weights file within `done_bytes` (small files come first, in hub order)."""
    before = 0
    for name, data in hub.repos[REPO].items():
        if name == WEIGHTS:
            return done_bytes - before
        before += len(data)
    raise AssertionError


def test_download_running_at_exit_resumes_at_next_start(app_env, qtbot, hub):
    hub.delay = 0.005
    first = manager(app_env, hub)
    first.start(REPO)
    qtbot.waitUntil(lambda: first.status(REPO).done_bytes > 100_000, timeout=20_000)
    first.shutdown()
    first.store.close()
    hub.delay = 0.0
    second = manager(app_env, hub, autostart=False)
    assert second.status(REPO).state == "paused"
    second.shutdown()
    second.store.close()
    third = manager(app_env, hub)                           # resumes it at once; reports arrive in the wait
    with qtbot.waitSignal(third.completed, timeout=20_000) as done:
        pass
    ranges = hub.file_gets(WEIGHTS)
    assert ranges[0] is None and ranges[-1].startswith("bytes=") and ranges[-1] != "bytes=0-"
    assert files_match(hub, Path(done.args[1]))


def test_corrupted_file_is_detected_and_fetched_again(app_env, qtbot, hub):
    hub.corrupt_once = {WEIGHTS, "tokenizer.json"}          # one LFS file (sha256), one git file (sha1)
    m = manager(app_env, hub)
    messages = []
    m.changed.connect(lambda repo: messages.append(m.status(repo).message))
    with qtbot.waitSignal(m.completed, timeout=20_000) as done:
        m.start(REPO)
    assert hub.file_gets(WEIGHTS) == [None, None] and hub.file_gets("tokenizer.json") == [None, None]
    assert any("checksum" in text for text in messages)
    assert files_match(hub, Path(done.args[1]))


def test_cancel_deletes_the_partial_files(app_env, qtbot, hub):
    hub.delay = 0.003
    m = manager(app_env, hub)
    m.start(REPO)
    qtbot.waitUntil(lambda: m.status(REPO).done_bytes > 50_000, timeout=20_000)
    m.cancel(REPO)
    qtbot.waitUntil(lambda: m.status(REPO) is None, timeout=10_000)
    assert not (app_env / "data" / "models" / "Qwen" / "Qwen3.5-Tiny").exists()
    assert m.store.downloads() == {}


def test_not_enough_disk_space_is_refused_before_starting(app_env, qtbot, hub, monkeypatch):
    monkeypatch.setattr("app.downloads.disk.free_bytes", lambda path: 10_000_000)
    m = manager(app_env, hub)
    m.start(REPO)
    wait_state(qtbot, m, "failed")
    assert m.status(REPO).message.startswith("Not enough free disk space")
    assert [r for r in hub.requests if "/resolve/" in r[1]] == []
    folder = app_env / "data" / "models" / "Qwen" / "Qwen3.5-Tiny"
    assert not folder.exists() or not any(folder.iterdir())


def test_a_silent_server_shows_as_stalled(app_env, qtbot, hub):
    hub.delay = 0.4                                          # 4 KiB every 0.4 s
    m = manager(app_env, hub, stall_after_s=0.2, chunk_size=65536)
    states = []
    m.changed.connect(lambda repo: states.append(m.status(repo) and m.status(repo).state))
    m.start(REPO)
    qtbot.waitUntil(lambda: "stalled" in states, timeout=10_000)
    assert "No data for" in m.status(REPO).message or "retrying" in m.status(REPO).message
    m.cancel(REPO)
    qtbot.waitUntil(lambda: m.status(REPO) is None, timeout=10_000)


def test_a_slow_link_shows_steady_progress_and_speed_never_stalled(app_env, qtbot, hub):
    """4 KiB every 50 ms (80 KB/s): each read takes what has arrived, so progress moves every tick; the speed is
    bytes over time; "stalled" waits for a second with no byte (the default chunk size, as the app uses it)."""
    hub.delay = 0.05
    store = Store(app_env / "data" / "qwendesk.sqlite3")
    m = DownloadManager(store, app_env / "data" / "models", endpoint=hub.url, stall_after_s=1.0)
    seen = []
    m.changed.connect(lambda repo: m.status(repo) and seen.append((m.status(repo).state, m.status(repo).done_bytes,
                                                                   m.status(repo).speed)))
    m.start(REPO)
    qtbot.waitUntil(lambda: m.status(REPO).done_bytes > 400_000, timeout=30_000)
    m.cancel(REPO)
    qtbot.waitUntil(lambda: m.status(REPO) is None, timeout=10_000)
    downloading = [(done, speed) for state, done, speed in seen if state == "downloading"]
    assert "stalled" not in [state for state, _, _ in seen]
    assert len({done for done, _ in downloading}) > 30                 # steps of a few KiB, not 1 MiB at once
    late = [speed for done, speed in downloading if done > 250_000]
    assert late and all(40_000 < speed < 160_000 for speed in late), late


def test_unknown_repository_fails_with_a_message(app_env, qtbot, hub):
    m = manager(app_env, hub)
    m.start("Qwen/Missing")
    qtbot.waitUntil(lambda: m.status("Qwen/Missing").state == "failed", timeout=10_000)
    assert "not found" in m.status("Qwen/Missing").message


def test_models_page_shows_downloads_and_the_result(app_env, qtbot, hub, monkeypatch):
    hub.delay = 0.01
    context = make_context(app_env, hub_endpoint=hub.url)
    smallest = min(context.catalog, key=lambda e: e.download_gb)
    context.catalog = [smallest.__class__(**{**smallest.__dict__, "id": REPO})]    # the page's only card
    monkeypatch.setattr("app.dialogs.confirm", lambda *a, **k: True)       # "too large here?": download anyway
    window = open_window(qtbot, context, autoload=False)
    window.downloads.stall_after_s = 30
    assert window.current_page == "models"
    page = window.models
    page.cards[0].button.click()
    qtbot.waitUntil(lambda: page.download_rows.get(REPO) is not None and
                    window.downloads.status(REPO).done_bytes > 200_000, timeout=20_000)
    row = page.download_rows[REPO]
    assert row.isVisible() and "of" in row.detail.text()
    screenshot(window, "models_downloading")
    row.pause.click()
    qtbot.waitUntil(lambda: window.downloads.status(REPO).state == "paused", timeout=10_000)
    assert row.resume.isVisible() and row.state.text() == "Paused"
    screenshot(window, "models_download_paused")
    hub.delay = 0.0
    row.resume.click()
    def wait_ready():
        return window.engine.model is not None
    qtbot.waitUntil(wait_ready, timeout=30_000)
    # the engine thread reports the load through a queued signal: wait for the page to show it
    qtbot.waitUntil(lambda: page.cards[0].state.text() == "Loaded", timeout=10_000)
    assert page.cards[0].button.text() == "Eject"
    assert [m.name for m in page.local] == [REPO]


def hf_cache_checkpoint(cache: Path, repo_id: str, checkpoint: Path) -> Path:
    """The Hugging Face cache's layout for one snapshot: blobs, a snapshot of links, refs/main."""
    repo_dir = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo_dir / "snapshots" / COMMIT_SHA
    snapshot.mkdir(parents=True)
    (repo_dir / "blobs").mkdir()
    for file in checkpoint.iterdir():
        blob = repo_dir / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
        blob.write_bytes(file.read_bytes())
        (snapshot / file.name).symlink_to(Path("..", "..", "blobs", blob.name))
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(COMMIT_SHA)
    return snapshot


COMMIT_SHA = "a" * 40


def test_models_on_disk_are_found_and_deleted(app_env, qtbot, checkpoint, monkeypatch):
    import shutil

    from app.local_models import DOWNLOAD_MARKER

    context = make_context(app_env, model_folders=[str(Path(checkpoint("base")).parent)])
    downloaded = context.models_dir / "Qwen" / "Downloaded"
    shutil.copytree(checkpoint("base"), downloaded)
    (downloaded / DOWNLOAD_MARKER).write_text("{}")
    hf_cache_checkpoint(context.hf_cache_dir, "Qwen/Cached", Path(checkpoint("base")))
    window = open_window(qtbot, context, autoload=False)
    page = window.models
    assert {(m.name, m.source) for m in page.local} == {("Qwen/Downloaded", "downloads"), ("Qwen/Cached", "hf-cache"),
                                                      ("base", "folder")}
    screenshot(window, "models_on_this_computer")
    monkeypatch.setattr("app.dialogs.confirm", lambda *args: True)
    for row in list(page.local_rows):
        if row.model.deletable:
            row.delete.click()
    assert [(m.name, m.source) for m in page.local] == [("base", "folder")]
    assert not downloaded.exists()
    assert not (context.hf_cache_dir / "models--Qwen--Cached").exists()
    assert [r.delete.isVisible() for r in page.local_rows] == [False]    # your own folders stay yours


def test_deleting_a_download_asks_first_and_hiding_a_finished_one_does_not(app_env, qtbot, hub, monkeypatch):
    hub.delay = 0.01
    context = make_context(app_env, hub_endpoint=hub.url)
    window = open_window(qtbot, context, autoload=False)
    window.downloads.stall_after_s = 30
    page = window.models
    page.download(REPO)
    qtbot.waitUntil(lambda: REPO in page.download_rows and window.downloads.status(REPO).done_bytes > 100_000,
                    timeout=20_000)
    row = page.download_rows[REPO]
    row.pause.click()
    qtbot.waitUntil(lambda: window.downloads.status(REPO).state == "paused", timeout=10_000)
    assert row.cancel.isVisible() and not row.forget.isVisible()
    assert row.cancel.icon().cacheKey() != row.forget.icon().cacheKey()
    screenshot(window, "models_download_paused_actions")
    asked = []
    monkeypatch.setattr("app.dialogs.confirm", lambda parent, title, text, action, keep="": asked.append(text) or False)
    row.cancel.click()
    folder = app_env / "data" / "models" / "Qwen" / "Qwen3.5-Tiny"
    assert len(asked) == 1 and "downloaded so far" in asked[0]
    assert window.downloads.status(REPO).state == "paused" and folder.exists()      # kept: the user said no
    monkeypatch.setattr("app.dialogs.confirm", lambda *args, **kw: True)
    row.cancel.click()
    qtbot.waitUntil(lambda: window.downloads.status(REPO) is None, timeout=10_000)
    assert not folder.exists()

    hub.delay = 0.0
    window.downloads.stall_after_s = 30
    monkeypatch.setattr("app.dialogs.confirm", lambda *args, **kw: asked.append("again") or False)
    window.engine.load = lambda config: None              # the finished download would load: not this test's job
    page.download(REPO)
    qtbot.waitUntil(lambda: window.downloads.status(REPO) is not None and
                    window.downloads.status(REPO).state == "ready", timeout=20_000)
    row = page.download_rows[REPO]
    assert row.forget.isVisible() and not row.cancel.isVisible()
    row.forget.click()                                    # only hides the row: no question, files kept
    qtbot.waitUntil(lambda: REPO not in page.download_rows, timeout=5_000)
    assert asked == [asked[0]] and folder.exists()


def test_a_damaged_checkpoint_says_why_and_downloads_again(app_env, qtbot, hub, checkpoint, monkeypatch):
    import shutil

    from app.local_models import DOWNLOAD_MARKER, checkpoint_problem

    context = make_context(app_env, hub_endpoint=hub.url)
    folder = context.models_dir / REPO
    shutil.copytree(checkpoint("base"), folder)
    (folder / DOWNLOAD_MARKER).write_text("{}")
    weights = folder / WEIGHTS
    weights.write_bytes(weights.read_bytes()[:-1000])                      # an interrupted copy
    assert "model.safetensors is truncated" in checkpoint_problem(folder)
    window = open_window(qtbot, context, autoload=False)
    page = window.models
    (row,) = page.local_rows
    assert row.problem.isVisible() and "truncated" in row.problem.text()
    assert not row.load.isVisible() and row.redownload.isVisible() and row.delete.isVisible()
    assert page.local_path_for(REPO) == "" and window.chat.local_models() == []    # nowhere offered to load
    screenshot(window, "models_damaged_checkpoint")
    monkeypatch.setattr("app.dialogs.confirm", lambda *args, **kw: True)
    row.redownload.click()
    qtbot.waitUntil(lambda: any(m.name == REPO and not m.problem for m in page.local), timeout=30_000)
    (row,) = page.local_rows
    # (the page may be behind the chat)
    assert not row.load.isHidden() and row.redownload.isHidden() and row.problem.isHidden()


def test_check_checkpoint_names_what_is_missing(tmp_path, checkpoint):
    import shutil

    from engine.api import CheckpointError, check_checkpoint

    check_checkpoint(checkpoint("base"))
    broken = tmp_path / "linked"
    broken.mkdir()
    shutil.copy(Path(checkpoint("base")) / "config.json", broken)
    (broken / WEIGHTS).symlink_to(tmp_path / "blob-never-downloaded")      # the hub cache after a failed fetch
    with pytest.raises(CheckpointError, match="cannot be read"):
        check_checkpoint(broken)


def test_a_catalog_models_block_drafter_downloads_with_it_and_becomes_its_drafter(app_env, qtbot, checkpoint,
                                                                                  tmp_path, monkeypatch):
    """A catalog card whose model has a published block drafter offers it beside the download; asked for, both
    download, and once both are whole on disk the drafter is the model's drafter in Settings (the engine's config)."""
    from tests.fixtures.drafters import write_drafter
    drafter_repo = "z-lab/Tiny-DFlash"
    base = Path(checkpoint("base"))
    server = FakeHub({REPO: base, drafter_repo: write_drafter(tmp_path / "drafter", base)})
    try:
        context = make_context(app_env, hub_endpoint=server.url)
        smallest = min(context.catalog, key=lambda e: e.download_gb)
        context.catalog = [smallest.__class__(**{**smallest.__dict__, "id": REPO, "drafter": drafter_repo,
                                                 "drafter_gb": 0.1})]
        monkeypatch.setattr("app.dialogs.confirm", lambda *a, **k: True)
        window = open_window(qtbot, context, autoload=False)
        card = window.models.cards[0]
        assert card.with_drafter.isVisibleTo(card) and not card.with_drafter.isChecked()
        assert "0.1 GB" in card.with_drafter.text()
        card.with_drafter.setChecked(True)
        screenshot(card, "models_card_with_drafter")
        card.button.click()
        qtbot.waitUntil(lambda: bool(window.context.settings.drafters), timeout=30_000)
        model = window.models.local_path_for(REPO)
        drafter = str(window.downloads.target_dir(drafter_repo))
        assert window.context.settings.drafters == {model: drafter}
        assert window.context.settings.engine_config(model).drafter == drafter
        assert not card.with_drafter.isVisibleTo(card)             # the model is on disk now
        assert [m.name for m in window.models.local] == [REPO]      # the drafter is not offered as a model
    finally:
        server.stop()
