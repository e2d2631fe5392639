"""The newest glibc the frozen app needs: every ELF file in the bundle, its undefined dynamic symbols' GLIBC_x.y
versions (objdump -T, from binutils). The AppImage runs only where the system's glibc is at least that; the bundle
takes its libraries (libstdc++, libexpat, ...) from the build machine, so the build machine decides it:

    python -m installer.linux.glibc dist/qwendesk [--max 2.35]     # exit 1 when a file needs more than --max
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

NEEDS = re.compile(r"\*UND\*.*\bGLIBC_(\d+)\.(\d+)(?:\.(\d+))?\b")


def is_elf(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(4) == b"\x7fELF"


def needed(path: Path) -> tuple[int, ...]:
    """The newest GLIBC version one ELF file's undefined symbols ask for; () for none."""
    tool = shutil.which("objdump")
    if tool is None:
        raise SystemExit("objdump not found: apt-get install binutils")
    out = subprocess.run([tool, "-T", str(path)], capture_output=True, text=True).stdout
    versions = [tuple(int(part) for part in m.groups() if part) for m in NEEDS.finditer(out)]
    return max(versions, default=())


def report(bundle: Path) -> dict:
    """{'highest': '2.34', 'files': {relative path: version}} for the files needing the highest version."""
    found = {path: needed(path) for path in sorted(bundle.rglob("*"))
             if path.is_file() and not path.is_symlink() and is_elf(path)}
    highest = max(found.values(), default=())
    return {"highest": ".".join(map(str, highest)), "elf_files": len(found),
            "files": sorted(str(path.relative_to(bundle)) for path, version in found.items() if version == highest)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--max", help="the oldest glibc the app supports (Ubuntu 22.04: 2.35)")
    args = parser.parse_args()
    result = report(args.bundle)
    print(json.dumps(result, indent=1))
    limit = tuple(int(part) for part in args.max.split(".")) if args.max else None
    if limit and tuple(int(part) for part in result["highest"].split(".")) > limit:
        print(f"the bundle needs glibc {result['highest']}, more than {args.max}: build on an older system",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
