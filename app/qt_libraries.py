"""Before Qt opens a window on Linux: are the system libraries its platform plugin needs installed?

Without them Qt aborts ("Could not load the Qt platform plugin "xcb"") and names at most one library, often not
the missing one. `ldd` on the plugin lists every library the loader cannot find; the message names their
Debian / Ubuntu packages in one line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

# soname -> Debian / Ubuntu package, for every system library Qt's xcb plugin and QtGui load (README's apt list)
DEBIAN_PACKAGES = {
    "libxcb.so.1": "libxcb1", "libxcb-cursor.so.0": "libxcb-cursor0", "libxcb-icccm.so.4": "libxcb-icccm4",
    "libxcb-image.so.0": "libxcb-image0", "libxcb-keysyms.so.1": "libxcb-keysyms1",
    "libxcb-randr.so.0": "libxcb-randr0", "libxcb-render.so.0": "libxcb-render0",
    "libxcb-render-util.so.0": "libxcb-render-util0", "libxcb-shape.so.0": "libxcb-shape0",
    "libxcb-shm.so.0": "libxcb-shm0", "libxcb-sync.so.1": "libxcb-sync1", "libxcb-util.so.1": "libxcb-util1",
    "libxcb-xfixes.so.0": "libxcb-xfixes0", "libxcb-xkb.so.1": "libxcb-xkb1",
    "libxkbcommon.so.0": "libxkbcommon0", "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
    "libX11.so.6": "libx11-6", "libX11-xcb.so.1": "libx11-xcb1", "libEGL.so.1": "libegl1", "libGL.so.1": "libgl1",
    "libGLX.so.0": "libglx0", "libOpenGL.so.0": "libopengl0", "libfontconfig.so.1": "libfontconfig1",
    "libfreetype.so.6": "libfreetype6", "libglib-2.0.so.0": "libglib2.0-0", "libgthread-2.0.so.0": "libglib2.0-0",
    "libdbus-1.so.3": "libdbus-1-3",
}


def xcb_plugin() -> Path:
    import PySide6      # the package only: its Qt libraries are not loaded yet

    return Path(PySide6.__file__).parent / "Qt" / "plugins" / "platforms" / "libqxcb.so"


def opens_with_xcb(environ=os.environ) -> bool:
    """Whether Qt will try its X11 plugin: Linux, no other platform asked for, not a Wayland session."""
    platform = environ.get("QT_QPA_PLATFORM", "")
    if not sys.platform.startswith("linux") or (platform and not platform.startswith("xcb")):
        return False
    return platform.startswith("xcb") or environ.get("XDG_SESSION_TYPE") != "wayland"


def missing_libraries(binary: Path) -> list[str]:
    """The sonames the dynamic loader cannot find for `binary` and what it loads ([] when ldd is not there)."""
    ldd = shutil.which("ldd")
    if ldd is None or not binary.is_file():
        return []
    out = subprocess.run([ldd, str(binary)], capture_output=True, text=True, timeout=30).stdout
    missing = [line.split("=>")[0].strip() for line in out.splitlines() if line.strip().endswith("=> not found")]
    return list(dict.fromkeys(missing))


def missing_message(sonames: list[str]) -> str:
    """One line: what is missing and the command that installs it."""
    packages = list(dict.fromkeys(DEBIAN_PACKAGES.get(s, s) for s in sonames))
    return (f"Qwen Desk cannot open its window: Qt needs system libraries that are not installed "
            f"({', '.join(sonames)}). On Debian / Ubuntu: sudo apt-get install {' '.join(packages)}")


def qt_library_problem(environ=os.environ, plugin: Path | None = None) -> str:
    """The one-line message when Qt's X11 plugin would fail to load, else ""."""
    if not opens_with_xcb(environ):
        return ""
    missing = missing_libraries(plugin or xcb_plugin())
    return missing_message(missing) if missing else ""
