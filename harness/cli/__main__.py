"""``python -m harness.cli`` is ``fencecheck``."""

import sys

from harness.cli import main

# Guarded: a process pool's spawned child imports the main module again.
if __name__ == "__main__":
    sys.exit(main())
