"""fencecheck harness: clusters, faults, processes, control, history, checkers, evidence.

Importing this package must stay cheap: workers import `harness.injection`
(stdlib only) and nothing else from here.
"""
