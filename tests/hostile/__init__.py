"""Small hostile workers: the reference worker with one contract-relevant behaviour
changed, each a separate command (``python -m tests.hostile.<name>``) that the
matrix runs as ``--worker-cmd``. They prove checks cannot be passed by accident
(tests/test_hostile_workers.py): each must get the verdict the contract promises.
"""
