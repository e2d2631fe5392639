"""The packaged app's sizes and times as the last `make test-package` measured them (test-artifacts/
package-measures.json), written into installer/README.md between its `measured` markers: the figures come from the
build, never by hand. `make test-package` runs it last; commit the README it rewrote.

    python -m installer.measures [--measures FILE] [--readme FILE]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- measured: begin (python -m installer.measures) -->", "<!-- measured: end -->"


def rows(m: dict) -> list[tuple[str, str]]:
    frozen, appdir, image = m.get("frozen", {}), m.get("appdir", {}), m.get("appimage", {})
    out = []
    if frozen:
        out.append(("frozen app `dist/qwendesk/`", f"{frozen['onedir_mb']:.0f} MB, {frozen['onedir_files']} files "
                                                   f"(the same for every PyTorch build: PyTorch is not in it)"))
        out.append(("CPU runtime (first launch, from `build/wheels`)", f"{frozen['runtime_mb'] / 1000:.1f} GB "
                    f"installed in {frozen['runtime_install_s']:.0f} s"))
        first, second = frozen["first_launch"], frozen["second_launch"]
        out.append(("launch to a usable window (frozen app)", f"first launch {first['launch_to_window_s']:.1f} s "
                    f"(the runtime's install included), second {second['launch_to_window_s']:.1f} s"))
    if appdir:
        out.append(("AppDir", f"{appdir['appdir_mb']:.0f} MB; its AppRun from a path with spaces: a window in "
                              f"{appdir['launch']['launch_to_window_s']:.1f} s"))
    if image:
        kind = "AppImage" if image["file"].endswith(".AppImage") else "squashfs image (no AppImage runtime given)"
        out.append((f"`make appimage`: {kind}", f"{image['mb']:.0f} MB ({image['file']}); unsquashed, it is the "
                                                 f"AppDir file for file and passes the smoke run"))
    if "offline_first_launch" in m:
        out.append(("first launch without network or wheels", f"\"No network\" and the folder button, the app "
                    f"closed after {m['offline_first_launch']['seconds_to_exit']:.1f} s"))
    if "glibc" in m:
        g = m["glibc"]
        out.append(("newest glibc the bundle needs", f"{g['highest']} ({', '.join(g['files'][:3])}), built on "
                                                     f"glibc {g['build_machine']}"))
    return out


def table(m: dict) -> str:
    lines = [BEGIN, f"Last `make test-package`: {datetime.date.today().isoformat()}, {platform.system()} "
                    f"{platform.machine()}, Python {platform.python_version()}.", "", "| what | measure |", "|---|---|"]
    lines += [f"| {what} | {value} |" for what, value in rows(m)]
    return "\n".join([*lines, END])


def write(measures: Path, readme: Path) -> None:
    text = readme.read_text(encoding="utf-8")
    block = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not block.search(text):
        raise SystemExit(f"{readme} has no {BEGIN} ... {END} block")
    new = table(json.loads(measures.read_text(encoding="utf-8")))
    readme.write_text(block.sub(lambda _: new, text), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--measures", type=Path, default=ROOT / "test-artifacts" / "package-measures.json")
    parser.add_argument("--readme", type=Path, default=ROOT / "installer" / "README.md")
    args = parser.parse_args()
    write(args.measures, args.readme)
    print(f"wrote the measured sizes into {args.readme}")


if __name__ == "__main__":
    main()
