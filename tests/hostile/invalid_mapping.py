"""The reference worker printing a mapping with a misspelt renewal model.

`fencecheck run` must refuse it before anything starts, naming the field
(``capabilities.renewal``), never fall back to the contract's default.
"""

from __future__ import annotations

import sys

from reference_impl import worker
from tests.hostile.declares_queue_only import MAPPING

if __name__ == "__main__":
    if sys.argv[1:2] == ["mapping"]:
        sys.stdout.write(MAPPING.replace("renewal: per_process", "renewal: per_job"))
        sys.exit(0)
    sys.exit(worker.main())
