-- MUTANT checkpoint_keeps_old_schema_version (rule 13): the fast path's
-- checkpoint UPDATE no longer sets the run's checkpoint_schema_version: the
-- run row names the version it had before (none, or the older one a resume
-- migrated from), not its latest checkpoint's (blind bug hunt round 4, #03).
CREATE OR REPLACE FUNCTION fencecheck.protected_write_fast(
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
           -- MUTANT: checkpoint_schema_version not set
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
