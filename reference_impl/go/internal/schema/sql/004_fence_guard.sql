-- The fencing token, guarded by the database itself (rule 12).
--
-- The seeds' protocol is plain SQL run by the worker (internal/protocol), so
-- the worker role must hold UPDATE on agent_runs, and PostgreSQL cannot tell
-- the worker's statements from any other statement of a session of that
-- role. This trigger keeps what the Chinese seed (section 4) puts in the
-- database because it is the easiest to bypass, the fencing token itself,
-- for every session that is not a superuser:
--   * the epoch only ever becomes epoch + 1, and only over a lease that is
--     free or expired by database time (a grant); never back, never a jump;
--   * an owner appears or changes only together with such a grant;
--   * the revision only ever becomes revision + 1;
--   * a terminal status (succeeded, failed, cancelled) never changes.
-- It does NOT decide who may write state: the Go code's lock, validation and
-- revision CAS do (a session of the worker role can still write a run's
-- revision and status directly; see docs/seed-code-findings.md, N).
CREATE FUNCTION fencecheck.guard_fence() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF current_setting('is_superuser') = 'on' THEN
    RETURN NEW;  -- the harness planting evidence (experiment M), migrations
  END IF;
  IF OLD.status IN ('succeeded', 'failed', 'cancelled') AND NEW.status <> OLD.status THEN
    RAISE EXCEPTION 'run % is % (terminal) and cannot become %', OLD.run_id, OLD.status, NEW.status
      USING ERRCODE = 'FC004';
  END IF;
  IF NEW.epoch <> OLD.epoch THEN
    IF NEW.epoch <> OLD.epoch + 1
       OR (OLD.owner IS NOT NULL AND OLD.lease_expires_at > clock_timestamp()) THEN
      RAISE EXCEPTION 'fencing token of run % may only go % -> % over a free or expired lease',
        OLD.run_id, OLD.epoch, OLD.epoch + 1 USING ERRCODE = 'FC012',
        DETAIL = format('asked epoch %s, lease of %s until %s', NEW.epoch, OLD.owner, OLD.lease_expires_at);
    END IF;
  ELSIF NEW.owner IS NOT NULL AND NEW.owner IS DISTINCT FROM OLD.owner THEN
    RAISE EXCEPTION 'run % changes owner without a new epoch', OLD.run_id USING ERRCODE = 'FC012';
  END IF;
  IF NEW.revision <> OLD.revision AND NEW.revision <> OLD.revision + 1 THEN
    RAISE EXCEPTION 'revision of run % may only go % -> %', OLD.run_id, OLD.revision, OLD.revision + 1
      USING ERRCODE = 'FC012';
  END IF;
  RETURN NEW;
END
$$;
CREATE TRIGGER agent_runs_fence_guard BEFORE UPDATE ON public.agent_runs
  FOR EACH ROW EXECUTE FUNCTION fencecheck.guard_fence();
