"""``fencecheck init-worker --lang python|go DIR``: write a small starting worker.

The template (harness/contract/templates/<lang>/, plus ``common/``, the
protocol's SQL both languages share) implements the worker contract v2 in
the simplest correct way and passes ``fencecheck contract`` as written
(tests/test_init_worker.py proves it); the contract's own ``schema.sql`` is
copied next to it, so the directory stands alone.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
from pathlib import Path

from harness.cli.common import UsageError
from harness.verdict import EXIT_PASS

NAME = "init-worker"
HELP = "write a small starting worker (python or go) that passes `fencecheck contract`"

CONTRACT_DIR = Path(__file__).resolve().parents[1] / "contract"
TEMPLATES = CONTRACT_DIR / "templates"
#: Each language's worker command (run from anywhere), and how to build it first.
COMMANDS = {
    "python": lambda d: f"{shlex.quote(sys.executable)} {shlex.quote(str(d / 'worker.py'))}",
    "go": lambda d: shlex.quote(str(d / "worker")),
}
BUILD = {"go": "go build -o worker ."}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", metavar="DIR", help="directory to write the worker into")
    parser.add_argument(
        "--lang", choices=sorted(COMMANDS), default="python", help="language (default python)"
    )
    parser.add_argument("--force", action="store_true", help="overwrite files already in DIR")


def files(lang: str) -> dict[str, Path]:
    """Name in DIR -> source: the template's files plus the contract's schema.sql."""
    chosen = {
        p.name: p
        for folder in (TEMPLATES / "common", TEMPLATES / lang)
        for p in sorted(folder.iterdir())
        if p.is_file()
    }
    return chosen | {"schema.sql": CONTRACT_DIR / "schema.sql"}


def write(lang: str, target: Path, force: bool = False) -> list[Path]:
    """Copy the template into ``target``; never overwrites without ``force``."""
    chosen = files(lang)
    clashes = [n for n in chosen if (target / n).exists()]
    if clashes and not force:
        raise UsageError(
            f"{target} already has {', '.join(sorted(clashes))}: choose an empty directory, "
            "or pass --force to overwrite them"
        )
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for name, source in chosen.items():
        shutil.copyfile(source, target / name)
        written.append(target / name)
    return written


def main(args: argparse.Namespace) -> int:
    target = Path(args.dir).resolve()
    written = write(args.lang, target, args.force)
    command = COMMANDS[args.lang](target)
    print(f"wrote a {args.lang} worker to {target}: {', '.join(p.name for p in written)}")
    print("next:")
    if args.lang in BUILD:
        print(f"  cd {shlex.quote(str(target))} && {BUILD[args.lang]}")
    print(f"  fencecheck contract --worker-cmd '{command}'   # conformant out of the box")
    print(f"  fencecheck run --worker-cmd '{command}'        # the matrix")
    print(f"(read {target / 'README.md'} for what it does and leaves out)")
    return EXIT_PASS
