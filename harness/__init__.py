"""fencecheck harness.

Roles, each in its own package:

* ``parts``: drivers of the real parts (PostgreSQL, toxiproxy, processes, control socket);
* ``backends``: where those parts run (local processes, containers);
* ``engine``: an experiment's environment and context, and the runner;
* ``checking``: worker histories and the checks experiments judge with;
* ``evidence``: archives, summaries and JUnit reports;
* ``mutation``: mutant runs that prove the matrix can fail;
* ``cli``: the ``fencecheck`` command.

Importing this package must stay cheap: workers import `harness.injection`
(stdlib only) and nothing else from here.
"""
