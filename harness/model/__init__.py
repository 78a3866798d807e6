"""The observation model: the one way the harness reads a system under test.

Like a Jepsen client turning a system's API into plain operations, the model
turns a system's own tables into the contract's vocabulary (section 6 of
docs/worker-contract.md): runs with their lease (owner, fencing token,
expiry in database time), progress writes, the side-effect ledger, the
outbox, consumers, tasks and operator actions. A system declares in its
mapping (section 14, ``model:``) which of its tables and columns, or which
expression over them, is each; the harness installs, after ``migrate``:

* a view per model relation in schema ``fencecheck_model``
  (:data:`entities.RELATION`), every live read of every checker and
  scenario goes through them;
* an audit trigger on every base table the mapping names, recording each
  change as the *model* rows it changed (``fencecheck_audit.changes``, table
  name = model relation), attributed to the session that made it; a change
  of a table the lease reads through (a worker heartbeat row) is recorded as
  the change of every run it moved.

No checker or scenario names a table or column of a system: a new system is a
new mapping, never a new checker. Modules: :mod:`.entities` (the vocabulary),
:mod:`.spec` (the mapping's ``model:`` section, validated), :mod:`.compile`
(views and triggers as SQL), :mod:`.install` (into a database).
"""

from __future__ import annotations
