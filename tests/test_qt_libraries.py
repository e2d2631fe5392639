"""The start-up check for Qt's system libraries: a real ELF whose libraries are missing, read by the real ldd."""

import shutil
import subprocess

import pytest

from app import qt_libraries
from app.main import main
from app.qt_libraries import missing_libraries, missing_message, opens_with_xcb, qt_library_problem

pytestmark = pytest.mark.skipif(not (shutil.which("gcc") and shutil.which("ldd")), reason="needs gcc and ldd")


def plugin_missing(tmp_path, sonames: list[str]):
    """A shared object linked against libraries named `sonames` that are then removed: what the loader sees
    on a machine without them."""
    (tmp_path / "stub.c").write_text("int stub(void) { return 0; }\n")
    links = []
    for i, soname in enumerate(sonames):
        lib = tmp_path / f"libgone{i}.so"
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", lib, tmp_path / "stub.c", f"-Wl,-soname,{soname}"],
                       check=True)
        links.append(f"-lgone{i}")
    plugin = tmp_path / "libqxcb.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", plugin, tmp_path / "stub.c", f"-L{tmp_path}",
                    "-Wl,--no-as-needed", *links], check=True)
    for i in range(len(sonames)):
        (tmp_path / f"libgone{i}.so").unlink()
    return plugin


def test_the_missing_libraries_are_named_in_one_line(tmp_path):
    # sonames no machine has (a real libxcb-icccm.so.4 would be found where it is installed)
    plugin = plugin_missing(tmp_path, ["libqwendesk-absent-a.so.4", "libqwendesk-absent-b.so.1"])
    assert missing_libraries(plugin) == ["libqwendesk-absent-a.so.4", "libqwendesk-absent-b.so.1"]
    message = qt_library_problem({"QT_QPA_PLATFORM": "xcb"}, plugin)
    assert "\n" not in message and "(libqwendesk-absent-a.so.4, libqwendesk-absent-b.so.1)" in message


def test_the_packages_are_debians_names():
    message = missing_message(["libxcb-icccm.so.4", "libxcb-keysyms.so.1", "libxcb-cursor.so.0"])
    assert message.endswith("sudo apt-get install libxcb-icccm4 libxcb-keysyms1 libxcb-cursor0")


def test_the_app_says_so_and_exits_before_qt_aborts(tmp_path, monkeypatch, capsys):
    plugin = plugin_missing(tmp_path, ["libqwendesk-absent.so.0"])
    monkeypatch.setattr(qt_libraries, "xcb_plugin", lambda: plugin)
    monkeypatch.setenv("QT_QPA_PLATFORM", "xcb")
    assert main([]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("apt-get install libqwendesk-absent.so.0")


def test_nothing_missing_and_other_platforms_pass(tmp_path):
    assert qt_library_problem({"QT_QPA_PLATFORM": "xcb"}, plugin_missing(tmp_path, [])) == ""
    assert not opens_with_xcb({"QT_QPA_PLATFORM": "offscreen"})
    assert not opens_with_xcb({"XDG_SESSION_TYPE": "wayland"})
    assert opens_with_xcb({"XDG_SESSION_TYPE": "wayland", "QT_QPA_PLATFORM": "xcb"})
