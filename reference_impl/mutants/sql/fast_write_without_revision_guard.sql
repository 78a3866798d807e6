-- MUTANT fast_write_without_revision_guard (rule 3): on the fast write path,
-- every transition but a checkpoint (an intent, a tool result, the completion,
-- a failure, a freeze, a requeue, a pause) updates the run without its
-- revision guard: the current holder's write at a revision the run has left
-- behind commits at current + 1 instead of being refused as a revision
-- conflict (blind bug hunt round 3, #03). The function is 006's, renamed by
-- 007 to the lock-first path.
CREATE OR REPLACE FUNCTION fencecheck._protected_write_lock_first(
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
     WHERE r.run_id = p_run_id  -- MUTANT: no revision guard
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
