"""``fencecheck verify REPORT_DIR``: has anything in a sealed run folder changed?"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from harness.cli.common import UsageError

NAME = "verify"
HELP = "re-hash a run folder against its MANIFEST.sha256 (exit 0 intact, 1 not)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("report_dir", help="a run's folder: reports/<run-id>")
    parser.add_argument(
        "--digest",
        help="the evidence digest you kept elsewhere (sha256:...); without it, verify "
        "proves only that the folder agrees with itself (see docs/report.md)",
    )


def main(args: argparse.Namespace) -> int:
    from harness.evidence.manifest import ManifestError, verify_report

    if args.digest and not re.fullmatch(r"sha256:[0-9a-f]{64}", args.digest):
        raise UsageError(f"--digest {args.digest!r} is not 'sha256:' and 64 hex digits")
    try:
        result = verify_report(Path(args.report_dir), expected_digest=args.digest)
    except ManifestError as exc:
        raise UsageError(str(exc)) from exc
    if result.intact:
        where = " and ".join(result.recorded) or "no summary or index"
        print(
            f"INTACT: {result.files} file(s) match MANIFEST.sha256 in {result.report_dir}; "
            f"evidence digest {result.digest} (as recorded in {where})"
            + ("; equals the digest given" if args.digest else "")
        )
        return 0
    print(f"NOT INTACT: {result.report_dir}")
    print("\n".join(result.lines()))
    print(f"evidence digest now: {result.digest}")
    return 1
