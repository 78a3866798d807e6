"""``python -m harness.cli`` is ``fencecheck``."""

import sys

from harness.cli import main

sys.exit(main())
