"""Generated mutants (`fencecheck mutants --auto`): generators, ids, selection, triage,
ordering, the mutated copy and the classification. No PostgreSQL needed."""

from __future__ import annotations

import argparse
import dataclasses
import threading
from collections import Counter
from pathlib import Path

import pytest

import scenarios
from harness.cli import main as cli_main
from harness.cli.explore import duration
from harness.cli.mutants import TRIAGE_FILE
from harness.engine import runner
from harness.engine.runner import Job, jobs_for
from harness.evidence.summary import ExperimentResult
from harness.mutation import auto, catalog, triage
from harness.mutation.ordering import CatcherOrder, named_targets
from harness.mutation.python_sites import python_sites, signatures
from harness.mutation.sites import AutoMutant, Edit, mutants_of_file
from harness.mutation.sql_sites import sql_sites
from harness.mutation.sql_tokens import tokenize
from harness.mutation.workspace import MutantWorkspace, PreflightFailed
from harness.verdict import Verdict

REPO = Path(__file__).resolve().parents[2]

SQL = """\
CREATE TABLE x (a int CHECK (a > 0));
-- a comment: WHERE a = 1
CREATE FUNCTION fencecheck.f(p_id uuid) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN
  UPDATE t SET a = 1, b = clock_timestamp() WHERE t.id = p_id AND t.exp > clock_timestamp();
  IF NOT FOUND THEN
    RAISE EXCEPTION 'run % = lost', p_id USING ERRCODE = 'FC001';
  END IF;
  PERFORM 1 FROM t WHERE t.id = p_id FOR UPDATE SKIP LOCKED;
  RAISE NOTICE 'only a notice';
END
$$;
"""

PY = """\
def f(a: int, b: int) -> int:
    log(_log, "x", flag=a == b)
    metrics.counter.labels("a" if a > b else "b").inc()
    if a > b:
        raise ValueError("no")
    h(a, "text")
    return g(a, b) + 1


def g(x: int, y: int) -> int:
    return x if x and not y else y


def h(x: int, s: str) -> None:
    pass
"""


def _sql_mutants(text: str = SQL) -> list[AutoMutant]:
    return mutants_of_file("sql", "f.sql", text, sql_sites(text, "f.sql", queries=False))


def _py_mutants(text: str = PY) -> list[AutoMutant]:
    sites = python_sites(text, "m.py", signatures({"m.py": text}))
    return mutants_of_file("python", "m.py", text, sites)


def _changes(mutants: list[AutoMutant]) -> set[tuple[str, str, str]]:
    return {(m.operator, " ".join(m.original.split()), m.replacement) for m in mutants}


def test_tokens_cover_every_sql_file_exactly() -> None:
    for path in sorted((REPO / "reference_impl" / "sql").glob("*/*.sql")):
        text = path.read_text()
        assert "".join(t.text for t in tokenize(text, path.name)) == text, path


def test_sql_sites_in_a_function_body() -> None:
    changes = _changes(_sql_mutants())
    assert ("negate_compare", "t.id = p_id", "t.id <> p_id") in changes
    assert ("negate_compare", "t.exp > clock_timestamp()", "t.exp <= clock_timestamp()") in changes
    assert ("clock_to_now", "t.exp > clock_timestamp()", "t.exp > now()") in changes
    assert ("drop_conjunct", "t.id = p_id", "") in changes
    assert ("drop_conjunct", "t.exp > clock_timestamp()", "") in changes
    assert (
        "and_or",
        "t.id = p_id AND t.exp > clock_timestamp()",
        "t.id = p_id OR t.exp > clock_timestamp()",
    ) in changes
    assert ("drop_not", "NOT FOUND", "FOUND") in changes
    assert ("drop_lock", "FOR UPDATE SKIP LOCKED", "") in changes
    assert ("drop_skip_locked", "SKIP LOCKED", "") in changes
    assert ("drop_where", "WHERE t.id = p_id", "") in changes
    operators = [m.operator for m in _sql_mutants()]
    assert operators.count("raise_noop") == 1  # the NOTICE is not an error
    assert operators.count("drop_statement") == 2  # the UPDATE and the PERFORM
    # Assignments are not comparisons; DDL, comments and strings are left alone.
    mutants = _sql_mutants()
    negated = sorted(m.original for m in mutants if m.operator == "negate_compare")
    assert negated == ["t.exp > clock_timestamp()", "t.id = p_id", "t.id = p_id"]
    assert [m.original for m in mutants if m.operator == "clock_to_now"] == [
        "t.exp > clock_timestamp()"
    ]
    body = SQL.index("AS $$") + len("AS $$")
    assert all(min(e.start for e in m.edits) > body for m in mutants)


def test_sql_mutants_change_only_their_bytes() -> None:
    for m in _sql_mutants():
        start = min(e.start for e in m.edits)
        end = max(e.end for e in m.edits)
        mutated = m.apply(SQL)
        assert mutated[:start] == SQL[:start]
        assert mutated[len(mutated) - (len(SQL) - end) :] == SQL[end:]
        assert mutated != SQL


def test_python_sites_skip_instrumentation_and_swap_only_same_types() -> None:
    changes = _changes(_py_mutants())
    assert ("negate_compare", "a > b", "a <= b") in changes
    assert ("drop_raise", 'raise ValueError("no")', "pass") in changes
    assert ("swap_args", "g(a, b)", "g(b, a)") in changes
    assert ("drop_increment", "g(a, b) + 1", "g(a, b)") in changes
    assert ("and_or", "x and not y", "x or not y") in changes
    assert ("drop_not", "not y", "y") in changes
    assert ("drop_call", 'h(a, "text")', "pass") in changes
    # Nothing inside log(...) or metrics...; h(int, str) is not swapped.
    assert not any("==" in m.original or '"a" if' in m.original for m in _py_mutants())
    assert not any(m.operator == "swap_args" and m.original.startswith("h(") for m in _py_mutants())


def test_ids_survive_unrelated_edits_and_follow_the_changed_code() -> None:
    for make, text, pad in (
        (_sql_mutants, SQL, "-- a new comment\nCREATE TABLE y (b int);\n\n"),
        (_py_mutants, PY, "import os\n\n\ndef other() -> None:\n    os.getcwd()\n\n\n"),
    ):
        before = {m.id for m in make(text)}
        after = make(pad + text)
        assert before <= {m.id for m in after}
        assert all(m.line > 1 for m in after if m.id in before)
    changed = {m.id for m in _sql_mutants(SQL.replace("t.id = p_id AND", "t.key = p_id AND"))}
    assert changed != {m.id for m in _sql_mutants()}


def test_catalog_of_the_repository() -> None:
    mutants = catalog.generate(REPO)
    assert len({m.id for m in mutants}) == len(mutants) > 500
    assert {m.language for m in mutants} == {"sql", "python"}
    assert not {m.path for m in mutants} & set(catalog.EXCLUDED)
    assert not any("/mutants/" in m.path or m.path.endswith("bench.py") for m in mutants)
    assert [m.id for m in catalog.generate(REPO)] == [m.id for m in mutants]  # deterministic


def test_select_patterns_language_and_seeded_sample() -> None:
    mutants = catalog.generate(REPO)
    renew = catalog.select(mutants, ["*:fencecheck.renew:*"])
    assert renew and all(m.scope == "fencecheck.renew" for m in renew)
    assert catalog.select(mutants, [renew[0].id]) == [renew[0]]
    sample = catalog.select(mutants, language="python", sample=7, seed=3)
    assert len(sample) == 7 and all(m.language == "python" for m in sample)
    assert sample == catalog.select(mutants, language="python", sample=7, seed=3)
    assert sample != catalog.select(mutants, language="python", sample=7, seed=4)
    with pytest.raises(catalog.UnknownMutantId, match="--list"):
        catalog.select(mutants, ["*no-such-thing*"])


def test_a_sample_is_proportional_to_every_file_and_operator_and_shuffled() -> None:
    mutants = catalog.generate(REPO)
    sample = catalog.select(mutants, sample=150, seed=12)
    assert len(sample) == 150 and len({m.id for m in sample}) == 150
    sizes = Counter(catalog.stratum(m) for m in mutants)
    drawn = Counter(catalog.stratum(m) for m in sample)
    for key, size in sizes.items():
        share = 150 * size / len(mutants)
        assert int(share) <= drawn[key] <= int(share) + 1, (key, size, drawn[key])
    # Run order is random (a --budget cut leaves a random subset unrun), not file order.
    position = {m.id: i for i, m in enumerate(mutants)}
    assert [position[m.id] for m in sample] != sorted(position[m.id] for m in sample)
    assert sample == catalog.select(mutants, sample=150, seed=12)


def test_a_sample_of_the_whole_selection_is_all_of_it_in_the_seeded_order() -> None:
    """`--sample <all> --seed S` runs the whole set in a random order, so a
    shard cut short by its --budget leaves a random part unrun, not the last
    files (until 2026-12-03 a sample as large as the set kept file order)."""
    mutants = catalog.select(catalog.generate(REPO), language="python")
    whole = catalog.select(mutants, sample=len(mutants), seed=21)
    assert sorted(m.id for m in whole) == sorted(m.id for m in mutants)
    assert [m.id for m in whole] != [m.id for m in mutants]
    assert catalog.select(mutants, sample=len(mutants) + 5, seed=21) == whole


def test_the_repositorys_triage_file_is_valid_and_current() -> None:
    judged = triage.load(TRIAGE_FILE)
    assert judged.equivalent, "the triage file lists no equivalent mutant"
    stale = judged.stale(m.id for m in catalog.generate(REPO))
    assert not stale, f"triage entries whose code changed (re-triage them): {stale}"


def test_triage_file_errors_name_the_entry(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("equivalent:\n  - id: a\n")
    with pytest.raises(triage.TriageError, match="entry 1: `reason`"):
        triage.load(path)
    path.write_text(
        "equivalent:\n  - {id: a, reason: r}\nsurvivors:\n  - {id: a, breaks: b, should_catch: c}\n"
    )
    with pytest.raises(triage.TriageError, match="listed twice"):
        triage.load(path)
    assert triage.load(tmp_path / "missing.yaml").equivalent == {}


def _mutant(scope: str = "fencecheck.renew", path: str = "reference_impl/sql/x.sql") -> AutoMutant:
    return AutoMutant(
        f"{path}:{scope}:negate_compare:0",
        "sql",
        path,
        1,
        scope,
        "negate_compare",
        "a = b",
        "a <> b",
        (Edit(0, 0, ""),),
    )


def _result(label: str, verdict: Verdict, duration_s: float = 1.0) -> ExperimentResult:
    experiment, _, variant = label.partition("-")
    return ExperimentResult(
        experiment_id=experiment,
        title=label,
        variant=variant or None,
        repeat_index=0,
        verdict=verdict,
        reason=f"{label} {verdict.value}",
        duration_s=duration_s,
        natural_wait_s=0.0,
        archive_path=None,
        invariant="",
    )


def test_order_learns_catchers_and_reads_named_hints() -> None:
    assert named_targets("SQL overlay renew_ignores_expiry.sql (fencecheck.renew)") == [
        "fencecheck.renew"
    ]
    assert named_targets("heartbeat_cls = X (overrides Heartbeat.on_unconfirmed)") == [
        "Heartbeat.on_unconfirmed"
    ]
    assert named_targets("statement 'durability_settings' replaced") == [
        "query.durability_settings"
    ]
    assert named_targets("SQL overlay rls_missing.sql (RLS on the tenant tables)") == []
    jobs = jobs_for(scenarios.all_modules(), 1)
    order = CatcherOrder([("SQL overlay a.sql (fencecheck.renew)", ("P",))])
    m = _mutant()
    first = order.order(m, jobs)
    assert sorted(j.label for j in first) == sorted(j.label for j in jobs)
    assert first[0].label == "P"
    order.learn(m, [_result("Q", Verdict.FAIL), _result("A", Verdict.PASS)])
    assert order.order(m, jobs)[0].label == "Q"  # what caught this function before
    other = _mutant("fencecheck.claim")
    assert order.order(other, jobs)[0].label == "Q"  # same file


def test_classify_only_a_fail_catches() -> None:
    m = _mutant()
    caught = auto.classify(m, [_result("A", Verdict.PASS), _result("P", Verdict.FAIL)])
    assert (caught.status, caught.caught_by) == ("caught", ["P"])
    assert auto.classify(m, [_result("A", Verdict.UNKNOWN)] * 3).status == "error"
    survived = auto.classify(m, [_result("A", Verdict.PASS), _result("B", Verdict.UNKNOWN)])
    assert survived.status == "survived" and "B: B unknown" in survived.detail


def test_run_until_fail_starts_nothing_after_a_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = jobs_for(scenarios.select(["A", "B", "C", "D", "P"]), 1)
    started: list[str] = []
    lock = threading.Lock()

    def fake_run_job(shared: object, job: Job, **_kw: object) -> ExperimentResult:
        with lock:
            started.append(job.label)
        return _result(job.label, Verdict.FAIL if job.label == "B" else Verdict.PASS)

    monkeypatch.setattr(runner, "run_job", fake_run_job)
    results = runner.run_jobs_until_fail(
        None,  # type: ignore[arg-type]
        jobs,
        report_dir=Path("/nonexistent"),
        seed=1,
        parallel=1,
    )
    assert started == ["A", "B"]
    assert [r.verdict for r in results] == [Verdict.PASS, Verdict.FAIL]


def test_run_until_fail_starts_nothing_once_told_to_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = jobs_for(scenarios.select(["A", "B", "C", "D", "P"]), 1)
    started: list[str] = []

    def fake_run_job(shared: object, job: Job, **_kw: object) -> ExperimentResult:
        started.append(job.label)
        return _result(job.label, Verdict.PASS)

    monkeypatch.setattr(runner, "run_job", fake_run_job)
    results = runner.run_jobs_until_fail(
        None,  # type: ignore[arg-type]
        jobs,
        report_dir=Path("/nonexistent"),
        seed=1,
        parallel=1,
        stop=lambda: len(started) >= 2,
    )
    assert started == ["A", "B"] and len(results) == 2


def test_workspace_runs_the_mutated_copy(tmp_path: Path) -> None:
    ids = (REPO / "reference_impl" / "ids.py").read_text()
    good = dataclasses.replace(
        _mutant("<module>", "reference_impl/ids.py"),
        language="python",
        edits=(Edit(0, 0, "# mutated\n"),),
    )
    ws = MutantWorkspace(good, REPO, tmp_path)
    ws.preflight()
    assert (ws.root / "reference_impl" / "ids.py").read_text() == "# mutated\n" + ids
    assert ws.worker_cmd[1].endswith("fencecheck_worker.py")
    ws.remove()
    assert not ws.root.exists()
    broken = dataclasses.replace(
        good, edits=(Edit(len(ids), len(ids), "import no_such_module_fencecheck\n"),)
    )
    with pytest.raises(PreflightFailed, match="no_such_module_fencecheck"):
        MutantWorkspace(broken, REPO, tmp_path).preflight()


def test_workspace_keeps_bytecode_except_the_mutated_modules(tmp_path: Path) -> None:
    import compileall

    repo = tmp_path / "repo"
    (repo / "reference_impl").mkdir(parents=True)
    for name in ("a", "b"):
        (repo / "reference_impl" / f"{name}.py").write_text(f"X = {name!r}\n")
    assert compileall.compile_dir(repo / "reference_impl", quiet=1)
    mutant = dataclasses.replace(
        _mutant("<module>", "reference_impl/a.py"),
        language="python",
        edits=(Edit(0, 0, "# mutated\n"),),
    )
    ws = MutantWorkspace(mutant, repo, tmp_path / "work")
    cached = sorted(p.name.split(".")[0] for p in ws.root.glob("reference_impl/__pycache__/*"))
    assert cached == ["b"]  # a's bytecode is of the original code


def test_duration_option() -> None:
    assert [duration(v) for v in ("90", "90s", "30m", "2h")] == [90, 90, 1800, 7200]
    with pytest.raises(argparse.ArgumentTypeError):
        duration("soon")


def test_cli_lists_without_running_and_refuses_unknown_ids(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli_main(["mutants", "--auto", "--list", "*:fencecheck.renew:drop_conjunct:*"]) == 0
    out = capsys.readouterr().out
    assert "r.lease_expires_at > clock_timestamp()" in out and "of " in out
    assert cli_main(["mutants", "--auto", "--diff", "*:fencecheck.renew:drop_conjunct:*"]) == 0
    assert (
        "+++ b/reference_impl/sql/migrations/015_renew_locks_first.sql" in capsys.readouterr().out
    )
    assert cli_main(["mutants", "--auto", "*no-such-mutant*"]) == 64
    assert cli_main(["mutants", "--auto", "--worker-cmd", "true", "--list"]) == 64


def test_a_catch_counts_only_when_the_correct_code_passes_its_catcher(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    answers: list[Verdict] = []

    def fake_run_jobs(shared: object, jobs: list[Job], **_kw: object) -> list[ExperimentResult]:
        return [_result(j.label, answers.pop(0)) for j in jobs]

    monkeypatch.setattr(auto, "run_jobs", fake_run_jobs)
    options = auto.AutoOptions(repo_root=REPO, report_dir=tmp_path)
    runner = auto._Runner(None, triage.Triage(), CatcherOrder(), options, print, 1)  # type: ignore[arg-type]

    def confirmed(*verdicts: Verdict) -> auto.AutoOutcome:
        answers[:] = list(verdicts)
        outcome = auto.classify(_mutant(), [_result("P", Verdict.FAIL)])
        runner.confirm(outcome, tmp_path)
        return outcome

    assert confirmed(Verdict.PASS).status == "caught"
    assert confirmed(Verdict.UNKNOWN, Verdict.PASS).status == "caught"  # retried once
    assert confirmed(Verdict.FAIL).status == "unconfirmed"
    outcome = confirmed(Verdict.UNKNOWN, Verdict.UNKNOWN)
    assert outcome.status == "unconfirmed" and "P gave unknown" in outcome.detail


def test_one_catcher_passing_unmutated_confirms_the_catch_quickest_first(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ran: list[str] = []
    answers = {"P": Verdict.PASS, "I": Verdict.PASS}

    def fake_run_jobs(shared: object, jobs: list[Job], **_kw: object) -> list[ExperimentResult]:
        ran.extend(j.label for j in jobs)
        return [_result(j.label, answers[j.label]) for j in jobs]

    monkeypatch.setattr(auto, "run_jobs", fake_run_jobs)
    options = auto.AutoOptions(repo_root=REPO, report_dir=tmp_path)
    order = CatcherOrder()
    order.durations.update({"P": 1.5, "I": 0.5})
    runner = auto._Runner(None, triage.Triage(), order, options, print, 1)  # type: ignore[arg-type]
    both = [_result("P", Verdict.FAIL), _result("I", Verdict.FAIL)]

    outcome = auto.classify(_mutant(), both)
    runner.confirm(outcome, tmp_path)
    assert (outcome.status, ran) == ("caught", ["I"]) and "I passes" in outcome.detail
    # I fails unmutated too (this load): P's pass still confirms the catch
    ran.clear()
    answers["I"] = Verdict.FAIL
    outcome = auto.classify(_mutant(), both)
    runner.confirm(outcome, tmp_path)
    assert (outcome.status, ran) == ("caught", ["I", "P"])
    assert runner.unreliable == {"I"}  # its later catches need another catcher


def test_a_catch_only_by_an_experiment_that_failed_unmutated_is_unconfirmed() -> None:
    m = _mutant()
    by_u = auto.classify(m, [_result("I", Verdict.FAIL)])
    assert auto.distrust(by_u, {"I"}).status == "unconfirmed"
    by_k = auto.classify(m, [_result("I", Verdict.FAIL), _result("P", Verdict.FAIL)])
    assert auto.distrust(by_k, {"I"}).status == "caught"  # K's fail still counts
    jobs = jobs_for(scenarios.select(["A", "P", "I"]), 1)
    assert [j.label for j in auto.last(jobs, {"A"})] == ["P", "I", "A"]


def _fn(name: str, params: str = "p_id uuid", *, replace: bool = False, body: str = "x") -> str:
    create = "CREATE OR REPLACE FUNCTION" if replace else "CREATE FUNCTION"
    return (
        f"{create} {name}({params}) RETURNS void LANGUAGE plpgsql AS $$\n"
        f"BEGIN PERFORM {body}; END\n$$;\n"
    )


def test_a_body_replaced_before_anything_runs_it_is_dead() -> None:
    from harness.mutation.superseded import superseded

    first = [
        ("001.sql", _fn("s.f") + _fn("s.g") + _fn("s.h") + _fn("s.k", "p_id uuid, p_n int")),
        # g's replacement is an overload (other parameters): both live
        ("002.sql", "GRANT EXECUTE ON FUNCTION s.h(uuid) TO r;\n" + _fn("s.g", "p_n int")),
        (
            "003.sql",
            _fn("s.f", replace=True)
            + _fn("s.h", replace=True)
            + _fn("s.k", "p_id uuid, p_n int", replace=True, body="s.f(p_id)"),
        ),
    ]
    dead = {(s.definition.path, s.definition.name): s for s in superseded(first)}
    # f: replaced, and nothing between names it; h: named by the GRANT between
    # (conservative: a statement naming it might run it); k: replaced, and the
    # call of f inside k's new body does not keep f's old body alive.
    assert set(dead) == {("001.sql", "s.f"), ("001.sql", "s.k")}
    assert "003.sql:1" in dead[("001.sql", "s.f")].reason
    # A DO block between that calls it keeps it alive.
    called = [first[0], ("002.sql", "DO $$ BEGIN PERFORM s.f(NULL); END $$;\n"), first[2]]
    assert ("001.sql", "s.f") not in {
        (s.definition.path, s.definition.name) for s in superseded(called)
    }


def test_a_list_of_names_that_only_grants_does_not_keep_a_body_alive() -> None:
    """010_function_grants.sql names every API function in a quoted list and
    only sets owners and grants with it: that runs none of them. Any other
    dynamic statement could call one by a name built at run time."""
    from harness.mutation.superseded import superseded

    def grants(extra: str = "") -> str:
        return (
            "DO $$ DECLARE f record; api constant text[] := ARRAY['settle', 'g']; BEGIN\n"
            "  FOR f IN SELECT p.oid::regprocedure AS sig, p.proname AS name FROM pg_proc p LOOP\n"
            "    EXECUTE format('ALTER FUNCTION %s OWNER TO o', f.sig);\n"
            "    EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f.sig);\n"
            "    IF f.name = ANY (api) THEN\n"
            "      EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO w', f.sig);\n"
            f"    END IF;{extra}\n  END LOOP;\nEND $$;\n"
        )

    def dead_with(between: str) -> bool:
        migrations = [
            ("001.sql", _fn("s.settle")),
            ("002.sql", between),
            ("003.sql", _fn("s.settle", replace=True)),
        ]
        return ("001.sql", "s.settle") in {
            (s.definition.path, s.definition.name) for s in superseded(migrations)
        }

    assert dead_with(grants())
    assert not dead_with(grants(" EXECUTE format('SELECT %s(NULL)', f.sig);"))
    assert not dead_with(grants(" PERFORM s.settle(NULL);"))


def test_the_generator_leaves_dead_migration_bodies_out() -> None:
    ids = [m.id for m in catalog.generate(REPO)]
    for scope in (
        "003_api.sql:fencecheck._ledger_freeze:",
        "004_ledger_outbox.sql:fencecheck.ledger_converge:",
    ):
        assert not [i for i in ids if scope in i], f"{scope} is replaced later: dead code"
    # their live replacements are mutated
    assert [i for i in ids if "011_freeze_only_in_doubt.sql:fencecheck._ledger_freeze:" in i]
    assert [i for i in ids if "009_operations.sql:fencecheck.ledger_converge:" in i]
