-- name: durability_settings
-- What a commit acknowledgement means on this server.
SELECT current_setting('synchronous_commit') AS synchronous_commit,
       current_setting('synchronous_standby_names') AS synchronous_standby_names,
       pg_is_in_recovery() AS in_recovery,
       current_setting('server_version') AS server_version;

-- name: replication_view
-- Standbys as far as this role may see them (columns are NULL without pg_read_all_stats).
SELECT application_name, state, sync_state FROM pg_stat_replication;
