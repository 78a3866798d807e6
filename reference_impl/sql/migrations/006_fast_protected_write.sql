-- The protected write's fast path, used by ProtectedWriter outside the
-- harness: the whole write in ONE function call that, for a checkpoint,
-- calls no other function (a nested PL/pgSQL call costs about as much as a
-- statement): the lock and the lease checks of lock_lease and the status of
-- _next_status are inline; only intents, tool results, freezes and requeues
-- call their ledger or duration helper, as protected_write does.
--
-- It makes exactly the checks of lock_lease + protected_write (003), in the
-- same order, with the same SQLSTATEs:
--   lock the lease row FOR UPDATE (waiting for any holder) -> FC003 if not
--   visible (missing, or another tenant's under RLS); owner + epoch -> FC001;
--   unexpired by database time read after the lock -> FC002; known
--   transition -> 22023; revision CAS in the UPDATE -> FC005; then the
--   transition's ledger change, the checkpoint row and the outbox row, all in
--   the caller's (implicit) transaction. tests/reference_impl/test_fast_write.py
--   holds both shapes to the same outcomes.
--
-- The stepped path under the harness keeps calling lock_lease and then
-- protected_write (which calls lock_lease again): mutants that overlay
-- either function change what the harness runs.
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
  k_owner text;
  k_epoch bigint;
  k_expires timestamptz;
  k_revision bigint;
  k_status text;
  v_status text;
  v_backoff interval;
  v_tenant uuid;
BEGIN
  -- Rule 2: the row lock first, then validate what the locked row says.
  SELECT x.owner, x.epoch, x.lease_expires_at, x.revision, x.status
    INTO k_owner, k_epoch, k_expires, k_revision, k_status
    FROM public.agent_runs x WHERE x.run_id = p_run_id FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'run % not found', p_run_id USING ERRCODE = 'FC003';
  END IF;
  v_now := clock_timestamp();  -- read after the lock: the expiry check and the lock wait
  IF k_owner IS DISTINCT FROM p_owner OR k_epoch <> p_epoch THEN
    RAISE EXCEPTION 'lease of run % lost', p_run_id USING ERRCODE = 'FC001',
      DETAIL = format('status=%s epoch=%s', k_status, k_epoch);
  END IF;
  IF k_expires <= v_now THEN
    RAISE EXCEPTION 'lease of run % expired', p_run_id USING ERRCODE = 'FC002',
      DETAIL = format('status=%s epoch=%s', k_status, k_epoch);
  END IF;
  IF p_transition = 'checkpoint' THEN
    -- Rule 3: the revision CAS. A checkpoint keeps the status and the lease,
    -- so it does not set them (the general UPDATE below would set them to
    -- what they are; this one does not fire the terminal-state trigger).
    UPDATE public.agent_runs r
       SET revision = r.revision + 1,
           current_step = COALESCE(p_current_step, r.current_step),
           checkpoint_schema_version = p_schema_version,
           updated_at = clock_timestamp()
     WHERE r.run_id = p_run_id AND r.revision = p_expected_revision
    RETURNING r.revision, r.status, r.tenant_id, date_part('epoch', v_now - t0) * 1000
      INTO revision, status, v_tenant, lock_wait_ms;
  ELSE
    -- fencecheck._next_status, inline (a checkpoint keeps k_status: above).
    v_status := CASE p_transition
      WHEN 'start' THEN 'running'
      WHEN 'intent' THEN 'waiting_tool'
      WHEN 'tool_result' THEN 'running'
      WHEN 'succeed' THEN 'succeeded'
      WHEN 'fail' THEN 'failed'
      WHEN 'freeze' THEN 'paused_indoubt'
      WHEN 'pause_human' THEN 'paused_human'
      WHEN 'requeue' THEN 'queued'
    END;
    IF v_status IS NULL THEN
      RAISE EXCEPTION 'unknown transition %', p_transition USING ERRCODE = '22023';
    END IF;
    IF p_transition = 'requeue' THEN
      v_backoff := fencecheck._ms(GREATEST(1, COALESCE((p_effect->>'backoff_ms')::bigint, 1)));
    END IF;
    -- Rule 3: the revision CAS. Terminal, frozen, paused and requeued runs give
    -- the lease up (epoch kept).
    UPDATE public.agent_runs r
       SET revision = r.revision + 1,
           status = CASE WHEN p_transition = 'requeue' AND r.attempt_count >= r.max_attempts
                         THEN 'failed' ELSE v_status END,
           terminal_reason = CASE
             WHEN p_transition = 'requeue' AND r.attempt_count >= r.max_attempts
               THEN 'attempts_exhausted'
             WHEN v_status IN ('running', 'waiting_tool') THEN r.terminal_reason
             ELSE COALESCE(p_payload->>'reason', r.terminal_reason) END,
           owner = CASE WHEN v_status IN ('running', 'waiting_tool') THEN r.owner END,
           lease_expires_at = CASE WHEN v_status IN ('running', 'waiting_tool')
                                   THEN r.lease_expires_at END,
           next_attempt_at = CASE WHEN p_transition = 'requeue'
                                  THEN clock_timestamp() + v_backoff ELSE r.next_attempt_at END,
           current_step = COALESCE(p_current_step, r.current_step),
           checkpoint_schema_version = p_schema_version,
           updated_at = clock_timestamp()
     WHERE r.run_id = p_run_id AND r.revision = p_expected_revision
    RETURNING r.revision, r.status, r.tenant_id, date_part('epoch', v_now - t0) * 1000
      INTO revision, status, v_tenant, lock_wait_ms;
  END IF;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'run % revision is not %', p_run_id, p_expected_revision
      USING ERRCODE = 'FC005', DETAIL = format('revision=%s', k_revision);
  END IF;
  IF p_transition IN ('intent', 'tool_result', 'freeze') THEN
    ledger_status := CASE p_transition
      WHEN 'intent' THEN fencecheck._ledger_register_intent(p_run_id, v_tenant, p_effect)
      WHEN 'tool_result' THEN fencecheck._ledger_tool_result(p_run_id, p_effect)
      WHEN 'freeze' THEN fencecheck._ledger_freeze(p_run_id, p_effect)
    END;
  END IF;
  INSERT INTO public.agent_checkpoints (run_id, revision, tenant_id, epoch, owner, transition,
                                        state_json, state_hash, schema_version, event_id)
  VALUES (p_run_id, revision, v_tenant, p_epoch, p_owner, p_transition,
          p_state, p_state_hash, p_schema_version, p_event_id);
  INSERT INTO public.outbox (event_id, tenant_id, run_id, event_type, payload)
  VALUES (p_event_id, v_tenant, p_run_id, p_event_type, p_payload);
END
$$;

-- As 005 does for every function (005 runs again after any overlay).
ALTER FUNCTION fencecheck.protected_write_fast(uuid, text, bigint, bigint, text, jsonb, bytea,
  integer, text, uuid, text, jsonb, jsonb) OWNER TO fencecheck_owner;
REVOKE ALL ON FUNCTION fencecheck.protected_write_fast(uuid, text, bigint, bigint, text, jsonb,
  bytea, integer, text, uuid, text, jsonb, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fencecheck.protected_write_fast(uuid, text, bigint, bigint, text, jsonb,
  bytea, integer, text, uuid, text, jsonb, jsonb) TO fencecheck_worker;
