"""Build the AppDir from the frozen app, and pack it into an AppImage:

    python -m installer.linux.build_appdir [--onedir dist/qwendesk] [--out dist/QwenDesk.AppDir]
    python -m installer.linux.build_appdir --pack [--runtime PATH]       # make appimage (APPIMAGE_RUNTIME=PATH)

An AppImage (type 2) is the AppImage runtime (a small ELF program that mounts or extracts what follows it and runs
its AppRun) followed by the AppDir as a squashfs image. The squashfs is made here with mksquashfs (Debian's
squashfs-tools), as appimagetool makes it (zstd, 1 MiB blocks, files owned by root); the runtime comes from no
package registry these machines reach, so it is given by path (the release workflow downloads the official one,
AppImage/type2-runtime). Without one, --pack stops at the squashfs image: dist/QwenDesk-x86_64.squashfs.
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
ELF_MAGIC = b"\x7fELF"


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


def squash(appdir: Path, image: Path) -> Path:
    """The AppDir as a squashfs image, as appimagetool packs it."""
    tool = shutil.which("mksquashfs") or "/usr/sbin/mksquashfs"
    if not Path(tool).is_file():
        raise SystemExit("mksquashfs not found: apt-get install squashfs-tools")
    image.unlink(missing_ok=True)
    subprocess.run([tool, str(appdir), str(image), "-root-owned", "-noappend", "-no-progress", "-quiet",
                    "-comp", "zstd", "-b", "1M", "-mkfs-time", "0"], check=True, stdout=subprocess.DEVNULL)
    return image


def pack(appdir: Path, image: Path, runtime: Path | None) -> Path:
    """The AppImage (runtime + squashfs), or the squashfs image alone when no runtime is given."""
    squashfs = squash(appdir, image.with_suffix(".squashfs"))
    if runtime is None:
        return squashfs
    head = runtime.read_bytes()
    if not head.startswith(ELF_MAGIC):
        raise SystemExit(f"{runtime} is not an AppImage runtime (not an ELF program)")
    with image.open("wb") as out, squashfs.open("rb") as body:
        out.write(head)
        shutil.copyfileobj(body, out)
    image.chmod(0o755)
    squashfs.unlink()
    return image


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--onedir", default=str(ROOT / "dist" / "qwendesk"))
    parser.add_argument("--out", default=str(ROOT / "dist" / "QwenDesk.AppDir"))
    parser.add_argument("--pack", action="store_true", help="pack the AppDir built before (make appimage)")
    parser.add_argument("--image", default=str(ROOT / "dist" / "QwenDesk-x86_64.AppImage"))
    parser.add_argument("--runtime", default=os.environ.get("APPIMAGE_RUNTIME") or None,
                        help="the AppImage type-2 runtime (default: $APPIMAGE_RUNTIME)")
    args = parser.parse_args()
    if not args.pack:
        print(f"AppDir: {build_appdir(Path(args.onedir), Path(args.out))}")
        return
    made = pack(Path(args.out), Path(args.image), Path(args.runtime) if args.runtime else None)
    print(f"AppImage: {made}" if made.suffix == ".AppImage" else
          f"squashfs image: {made} (no AppImage runtime given: APPIMAGE_RUNTIME=PATH makes the AppImage)")


if __name__ == "__main__":
    main()
