"""Build the AppDir from the frozen app, and pack it into an AppImage where appimagetool is on PATH:

    python -m installer.linux.build_appdir [--onedir dist/qwendesk] [--out dist/QwenDesk.AppDir]

appimagetool (and the AppImage runtime it prepends) comes from no package registry that this project's
machines reach; without it the AppDir is the result here and the release workflow packs the AppImage.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from pathlib import Path

from installer.icons import LOGO, render_png

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
METAINFO = "io.github.qwendesk.QwenDesk.metainfo.xml"


def build_appdir(onedir: Path, out: Path) -> Path:
    if not (onedir / "qwendesk").is_file():
        raise SystemExit(f"{onedir}/qwendesk not found: build the frozen app first (make package)")
    shutil.rmtree(out, ignore_errors=True)
    usr = out / "usr"
    shutil.copytree(onedir, usr / "lib" / "qwendesk", symlinks=True)
    shutil.copy2(HERE / "AppRun", out / "AppRun")
    for folder in (out, usr / "share" / "applications"):
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy2(HERE / "qwendesk.desktop", folder / "qwendesk.desktop")
    (usr / "share" / "metainfo").mkdir(parents=True)
    shutil.copy2(HERE / METAINFO, usr / "share" / "metainfo" / METAINFO)
    icons = usr / "share" / "icons" / "hicolor"
    (icons / "scalable" / "apps").mkdir(parents=True)
    shutil.copy2(LOGO, icons / "scalable" / "apps" / "qwendesk.svg")
    for size in (64, 128, 256):
        render_png(size, icons / f"{size}x{size}" / "apps" / "qwendesk.png")
    shutil.copy2(icons / "256x256" / "apps" / "qwendesk.png", out / "qwendesk.png")
    (out / ".DirIcon").symlink_to("qwendesk.png")
    return out


def pack(appdir: Path, image: Path) -> Path | None:
    """The AppImage, or None when appimagetool is not on PATH."""
    tool = shutil.which("appimagetool")
    if tool is None:
        return None
    subprocess.run([tool, str(appdir), str(image)], check=True, env=dict(os.environ, ARCH="x86_64"))
    return image


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--onedir", default=str(ROOT / "dist" / "qwendesk"))
    parser.add_argument("--out", default=str(ROOT / "dist" / "QwenDesk.AppDir"))
    parser.add_argument("--image", default=str(ROOT / "dist" / "QwenDesk-x86_64.AppImage"))
    args = parser.parse_args()
    appdir = build_appdir(Path(args.onedir), Path(args.out))
    print(f"AppDir: {appdir}")
    image = pack(appdir, Path(args.image))
    print(f"AppImage: {image}" if image else "appimagetool not on PATH: AppImage not packed (the release workflow "
                                             "packs it)")


if __name__ == "__main__":
    main()
