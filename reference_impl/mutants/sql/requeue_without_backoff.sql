-- MUTANT requeue_without_backoff (rule 4): a requeued run is due again at
-- once: the backoff the worker asked for is ignored, so a refusing tool is
-- asked again and again without waiting.
CREATE OR REPLACE FUNCTION fencecheck.protected_write(
  p_run_id uuid, p_owner text, p_epoch bigint, p_expected_revision bigint,
  p_transition text, p_state jsonb, p_state_hash bytea, p_schema_version integer,
  p_current_step text, p_event_id uuid, p_event_type text, p_payload jsonb,
  p_effect jsonb DEFAULT NULL)
RETURNS TABLE (revision bigint, status text, lock_wait_ms double precision, ledger_status text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_lock record;
  v_status text;
  v_gives_up boolean;
  v_backoff interval;
  v_reason text;
  v_run public.agent_runs%ROWTYPE;
  v_ledger text;
BEGIN
  SELECT * INTO v_lock FROM fencecheck.lock_lease(p_run_id, p_owner, p_epoch);
  v_status := fencecheck._next_status(p_transition, v_lock.status);
  IF v_status IS NULL THEN
    RAISE EXCEPTION 'unknown transition %', p_transition USING ERRCODE = '22023';
  END IF;
  v_gives_up := v_status NOT IN ('running', 'waiting_tool');
  v_reason := CASE WHEN v_gives_up THEN p_payload->>'reason' END;
  IF p_transition = 'requeue' THEN
    v_backoff := fencecheck._ms(GREATEST(1, COALESCE((p_effect->>'backoff_ms')::bigint, 1)));
  END IF;
  UPDATE public.agent_runs r
     SET revision = r.revision + 1,
         status = CASE WHEN p_transition = 'requeue' AND r.attempt_count >= r.max_attempts
                       THEN 'failed' ELSE v_status END,
         terminal_reason = CASE WHEN p_transition = 'requeue' AND r.attempt_count >= r.max_attempts
                                THEN 'attempts_exhausted' ELSE COALESCE(v_reason, r.terminal_reason) END,
         owner = CASE WHEN v_gives_up THEN NULL ELSE r.owner END,
         lease_expires_at = CASE WHEN v_gives_up THEN NULL ELSE r.lease_expires_at END,
         next_attempt_at = CASE WHEN p_transition = 'requeue'  -- MUTANT: no backoff
                                THEN clock_timestamp() ELSE r.next_attempt_at END,
         current_step = COALESCE(p_current_step, r.current_step),
         checkpoint_schema_version = p_schema_version,
         updated_at = clock_timestamp()
   WHERE r.run_id = p_run_id AND r.revision = p_expected_revision
  RETURNING r.* INTO v_run;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'run % revision is not %', p_run_id, p_expected_revision
      USING ERRCODE = 'FC005', DETAIL = format('revision=%s', v_lock.revision);
  END IF;
  v_ledger := CASE p_transition
    WHEN 'intent' THEN fencecheck._ledger_register_intent(p_run_id, v_run.tenant_id, p_effect)
    WHEN 'tool_result' THEN fencecheck._ledger_tool_result(p_run_id, p_effect)
    WHEN 'freeze' THEN fencecheck._ledger_freeze(p_run_id, p_effect)
  END;
  INSERT INTO public.agent_checkpoints (run_id, revision, tenant_id, epoch, owner, transition,
                                        state_json, state_hash, schema_version, event_id)
  VALUES (p_run_id, v_run.revision, v_run.tenant_id, p_epoch, p_owner, p_transition,
          p_state, p_state_hash, p_schema_version, p_event_id);
  INSERT INTO public.outbox (event_id, tenant_id, run_id, event_type, payload)
  VALUES (p_event_id, v_run.tenant_id, p_run_id, p_event_type, p_payload);
  RETURN QUERY SELECT v_run.revision, v_run.status, v_lock.lock_wait_ms, v_ledger;
END
$$;
