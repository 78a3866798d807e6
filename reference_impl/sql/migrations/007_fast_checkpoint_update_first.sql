-- The checkpoint, the hot transition, in ONE statement on its success path.
--
-- 006's fast path locks the lease row with SELECT ... FOR UPDATE and then
-- UPDATEs it: two visits to the row and a lock record in the WAL before the
-- update's own. Here a checkpoint goes straight to the UPDATE, which takes
-- the same row lock:
--   - owner, epoch and the revision CAS are in its WHERE. A holder of the
--     row lock makes it wait; if the holder changed the row (a takeover's
--     epoch + 1, another write's revision), PostgreSQL re-reads the new
--     version and re-checks the WHERE against it (READ COMMITTED), so a
--     stale owner matches nothing;
--   - the expiry is judged after the UPDATE, against clock_timestamp() read
--     then, i.e. after the lock was granted, as lock_lease does. (It cannot
--     sit in the WHERE: PostgreSQL re-checks a WHERE only against a CHANGED
--     row, so behind a holder that changed nothing the expiry would have
--     been judged before the wait.) An expired lease raises FC002, and the
--     raise undoes the UPDATE.
-- When the UPDATE matches nothing, and for every other transition, 006's
-- function runs unchanged, renamed to fencecheck._protected_write_lock_first
-- (owner-only, like every helper): it names the failed check with the same
-- SQLSTATE, in the same order, as the stepped path (FC003, FC001, FC002,
-- FC005). tests/reference_impl/test_fast_write.py holds both shapes to the
-- same outcomes.

ALTER FUNCTION fencecheck.protected_write_fast(uuid, text, bigint, bigint, text, jsonb, bytea, integer, text, uuid, text, jsonb, jsonb)
  RENAME TO _protected_write_lock_first;
REVOKE ALL ON FUNCTION fencecheck._protected_write_lock_first(uuid, text, bigint, bigint, text, jsonb, bytea, integer, text, uuid, text, jsonb, jsonb) FROM fencecheck_worker;

CREATE FUNCTION fencecheck.protected_write_fast(
  p_run_id uuid, p_owner text, p_epoch bigint, p_expected_revision bigint,
  p_transition text, p_state jsonb, p_state_hash bytea, p_schema_version integer,
  p_current_step text, p_event_id uuid, p_event_type text, p_payload jsonb,
  p_effect jsonb DEFAULT NULL,
  OUT revision bigint, OUT status text, OUT lock_wait_ms double precision,
  OUT ledger_status text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  t0 timestamptz := clock_timestamp();
  v_now timestamptz;
  v_expires timestamptz;
  v_tenant uuid;
BEGIN
  IF p_transition = 'checkpoint' THEN
    -- Rules 2 and 3 in one statement: the row lock, owner + epoch, the CAS.
    UPDATE public.agent_runs r
       SET revision = r.revision + 1,
           current_step = COALESCE(p_current_step, r.current_step),
           checkpoint_schema_version = p_schema_version,
           updated_at = clock_timestamp()
     WHERE r.run_id = p_run_id AND r.owner = p_owner AND r.epoch = p_epoch
       AND r.revision = p_expected_revision
    RETURNING r.revision, r.status, r.tenant_id, r.lease_expires_at
      INTO revision, status, v_tenant, v_expires;
    IF FOUND THEN
      v_now := clock_timestamp();  -- read after the lock was granted
      IF v_expires <= v_now THEN
        RAISE EXCEPTION 'lease of run % expired', p_run_id USING ERRCODE = 'FC002',
          DETAIL = format('status=%s epoch=%s', status, p_epoch);
      END IF;
      lock_wait_ms := date_part('epoch', v_now - t0) * 1000;
      INSERT INTO public.agent_checkpoints (run_id, revision, tenant_id, epoch, owner,
                                            transition, state_json, state_hash,
                                            schema_version, event_id)
      VALUES (p_run_id, revision, v_tenant, p_epoch, p_owner, p_transition,
              p_state, p_state_hash, p_schema_version, p_event_id);
      INSERT INTO public.outbox (event_id, tenant_id, run_id, event_type, payload)
      VALUES (p_event_id, v_tenant, p_run_id, p_event_type, p_payload);
      RETURN;
    END IF;
  END IF;
  -- A checkpoint that matched nothing (a check failed: the lock-first code
  -- names which), or any other transition.
  SELECT w.revision, w.status, w.lock_wait_ms, w.ledger_status
    INTO revision, status, lock_wait_ms, ledger_status
    FROM fencecheck._protected_write_lock_first(
      p_run_id, p_owner, p_epoch, p_expected_revision, p_transition, p_state, p_state_hash,
      p_schema_version, p_current_step, p_event_id, p_event_type, p_payload, p_effect) w;
END
$$;

-- As 005 does for every function (005 runs again after any overlay).
ALTER FUNCTION fencecheck.protected_write_fast(uuid, text, bigint, bigint, text, jsonb, bytea, integer, text, uuid, text, jsonb, jsonb) OWNER TO fencecheck_owner;
REVOKE ALL ON FUNCTION fencecheck.protected_write_fast(uuid, text, bigint, bigint, text, jsonb, bytea, integer, text, uuid, text, jsonb, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fencecheck.protected_write_fast(uuid, text, bigint, bigint, text, jsonb, bytea, integer, text, uuid, text, jsonb, jsonb) TO fencecheck_worker;
