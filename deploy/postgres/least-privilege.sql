-- Least-privilege PostgreSQL roles for urutan (see README.md next to this file).
--
-- Run it in urutan's database as its owner (or a superuser), after
-- `urutan migrate` created the tables, and again after each upgrade:
--
--   WORKER_PASSWORD='...' RELAY_PASSWORD='...' PRODUCER_PASSWORD='...' \
--     psql "postgres://owner@host/urutan" -v ON_ERROR_STOP=1 \
--          -f deploy/postgres/least-privilege.sql
--
-- Role names default to urutan_worker, urutan_relay and urutan_producer;
-- override them with -v worker_role=... -v relay_role=... -v producer_role=...
-- An operator role for `urutan dlq` is made only when named:
-- -v operator_role=urutan_operator (password from OPERATOR_PASSWORD); so is
-- a dispatcher role for `urutan effects`: -v dispatcher_role=urutan_dispatcher
-- (password from DISPATCHER_PASSWORD).
-- A role is created (LOGIN) if missing and gets its password from the
-- environment (never a command line) when the variable is set; re-running is
-- safe. Needs psql 15+ (\getenv).
--
--   worker    `urutan run`: applies events (dedup, versioned write, history),
--             parks and releases messages across ring changes, opens epochs,
--             records reshardings, purges expired message ids. No DDL, no
--             access to the outbox.
--   relay     `urutan relay`: reads, marks and purges outbox rows; opens
--             epochs (on every broker connect). Nothing else.
--   producer  your application: may only add rows to the outbox (INSERT of
--             agregat_tipe, agregat_id, routing_key, payload, traceparent,
--             or SELECT urutan_enqueue(...)).
--   operator  `urutan dlq`: reads and resolves dead-letter records, records
--             messages found in the DLQ without one, reads the state that
--             says what a replayed message became, lists and replays
--             dead-lettered effects. Nothing else.
--   dispatcher `urutan effects`: writes the routes, claims, settles and
--             purges effect rows. Nothing else (the worker's apply records
--             effects through a SECURITY DEFINER trigger: it needs no grant).
--
-- Migrations stay with the owner: a worker or relay started before
-- `urutan migrate` stops with "migration(s) pending ... run `urutan migrate`
-- as the database owner".

\set ON_ERROR_STOP on
-- The pipeline's DATABASE_SCHEMA (default public): -v schema=billing grants
-- on the tables and functions of that schema. Run it once per pipeline.
\if :{?schema}
\else
\set schema public
\endif
\if :{?worker_role}
\else
\set worker_role urutan_worker
\endif
\if :{?relay_role}
\else
\set relay_role urutan_relay
\endif
\if :{?producer_role}
\else
\set producer_role urutan_producer
\endif
\getenv worker_password WORKER_PASSWORD
\getenv relay_password RELAY_PASSWORD
\getenv producer_password PRODUCER_PASSWORD
\getenv operator_password OPERATOR_PASSWORD
\getenv dispatcher_password DISPATCHER_PASSWORD
SELECT current_database() AS dbname \gset

BEGIN;
-- Every name below is the pipeline's own.
SET LOCAL search_path = :"schema";

-- Only the roles granted below (and the owner) may connect, and none may
-- create temporary objects: PostgreSQL gives every role (PUBLIC) CONNECT
-- and TEMPORARY on a new database.
REVOKE CONNECT, TEMPORARY ON DATABASE :"dbname" FROM PUBLIC;

SELECT NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'worker_role') AS missing \gset
\if :missing
CREATE ROLE :"worker_role" LOGIN;
\endif
SELECT NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'relay_role') AS missing \gset
\if :missing
CREATE ROLE :"relay_role" LOGIN;
\endif
SELECT NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'producer_role') AS missing \gset
\if :missing
CREATE ROLE :"producer_role" LOGIN;
\endif
\if :{?worker_password}
ALTER ROLE :"worker_role" PASSWORD :'worker_password';
\endif
\if :{?relay_password}
ALTER ROLE :"relay_role" PASSWORD :'relay_password';
\endif
\if :{?producer_password}
ALTER ROLE :"producer_role" PASSWORD :'producer_password';
\endif

GRANT CONNECT ON DATABASE :"dbname" TO :"worker_role", :"relay_role", :"producer_role";
GRANT USAGE ON SCHEMA :"schema" TO :"worker_role", :"relay_role", :"producer_role";
-- Every process checks at start that the migrations are applied.
GRANT SELECT ON _sqlx_migrations TO :"worker_role", :"relay_role";

-- Worker: the contract tables (DELETE on pesan_diproses: retention; UPDATE:
-- its purge locks the rows it deletes) ...
GRANT SELECT, INSERT, UPDATE ON pesanan TO :"worker_role";
GRANT SELECT, INSERT, UPDATE, DELETE ON pesan_diproses TO :"worker_role";
-- urutan_klaim_lama reads the default partition itself (the claims recorded
-- before claims had orders): without it a stale or set-aside version fails
-- with "permission denied" and its shard waits (migration 0044).
GRANT SELECT ON pesan_diproses_awal TO :"worker_role";
GRANT SELECT, INSERT ON pesanan_riwayat TO :"worker_role";
-- ... their day partitions: created ahead and expired by the pool's
-- retention (SECURITY DEFINER functions of the owner; migration 0026;
-- expired days detached, then dropped: migration 0036) ...
GRANT EXECUTE ON FUNCTION urutan_partisi_siapkan(INT), urutan_partisi_buang(TEXT, INTERVAL),
    urutan_partisi_lepas(TEXT, INTERVAL), urutan_partisi_hapus(TEXT),
    urutan_awal_pangkas(TEXT, INTERVAL, INT) TO :"worker_role";
-- (the pool's retention pass also creates the id-range partitions of the
-- outbox and the effects ahead: migration 0033)
GRANT EXECUTE ON FUNCTION urutan_partisi_id_siapkan(BOOLEAN) TO :"worker_role";
GRANT USAGE ON SEQUENCE pesanan_riwayat_seq_seq TO :"worker_role";
-- ... and the ring-change bookkeeping (epochs, shard positions, parked
-- messages, the recorded ring).
GRANT SELECT, INSERT ON urutan_epoch TO :"worker_role", :"relay_role";
GRANT USAGE ON SEQUENCE urutan_epoch_epoch_seq TO :"worker_role", :"relay_role";
-- Opening an epoch prunes the oldest ones (SECURITY DEFINER, not PUBLIC's:
-- migration 0039).
GRANT EXECUTE ON FUNCTION urutan_epoch_pangkas(INT) TO :"worker_role", :"relay_role";
-- The apply asks whether effects are configured (SECURITY DEFINER: the
-- worker needs no rights on the effect tables).
GRANT EXECUTE ON FUNCTION urutan_efek_aktif() TO :"worker_role";
GRANT SELECT, INSERT, UPDATE ON urutan_shard TO :"worker_role";
GRANT SELECT ON urutan_shard TO :"relay_role";
GRANT SELECT, INSERT, UPDATE, DELETE ON urutan_parkir TO :"worker_role";
GRANT USAGE ON SEQUENCE urutan_parkir_seq_seq TO :"worker_role";
GRANT SELECT, INSERT, UPDATE ON urutan_ring TO :"worker_role";
GRANT USAGE ON SEQUENCE urutan_ring_versi_seq TO :"worker_role";
-- Windows (ring changes not yet behind every shard): opened by the pool
-- before a resharding or after a broker restart, given their epoch once it
-- is open (by the relay too, for a change cut short), marked closed.
GRANT SELECT, INSERT, UPDATE ON urutan_jendela TO :"worker_role";
GRANT USAGE ON SEQUENCE urutan_jendela_jendela_seq TO :"worker_role";
GRANT SELECT, UPDATE ON urutan_jendela TO :"relay_role";
-- The previous version's "ring change under way" flag, for its replicas
-- during a rolling upgrade (this version no longer uses it).
GRANT SELECT, INSERT, DELETE ON urutan_ring_berubah TO :"worker_role";
GRANT SELECT, DELETE ON urutan_ring_berubah TO :"relay_role";
-- Replicas share the shards (docs/contract.md section 13): each renews its
-- lease row, deletes expired ones and its own at a graceful stop, and the
-- one renewing rewrites the placement (INSERT ... ON CONFLICT needs UPDATE).
GRANT SELECT, INSERT, UPDATE, DELETE ON urutan_replika, urutan_penempatan TO :"worker_role";

-- Dead-letter records: written before each reject (INSERT ... RETURNING
-- needs SELECT), resolved ones purged after DEAD_LETTER_RETENTION (DELETE;
-- UPDATE: the purge locks the rows it deletes).
GRANT SELECT, INSERT, UPDATE, DELETE ON urutan_dead_letter TO :"worker_role";
GRANT USAGE ON SEQUENCE urutan_dead_letter_id_seq TO :"worker_role";

-- Held orders (a refused version holds its order; its replay ends the
-- hold). UPDATE on urutan_parkir above: a set-aside message's attempts.
GRANT SELECT, INSERT, DELETE ON urutan_tahan TO :"worker_role";
-- With GAP_POLICY=wait the release reads the skips (a released hold lets
-- the waiting versions past its gap).
GRANT SELECT ON urutan_lewati TO :"worker_role";

-- Stale arrivals, for `urutan explain`: written by the apply, purged after
-- DEDUP_RETENTION (UPDATE: the purge locks the rows it deletes).
GRANT SELECT, INSERT, UPDATE, DELETE ON urutan_basi TO :"worker_role";
GRANT USAGE ON SEQUENCE urutan_basi_seq_seq TO :"worker_role";

-- urutan_enqueue's defaults (entity, topology prefix, MAX_BODY_BYTES):
-- `urutan run` writes its own settings when they differ.
GRANT SELECT, UPDATE ON urutan_pengaturan TO :"worker_role";

-- Messages handed back after a failure, until they are back (recorded
-- before the requeue, deleted when applied or dead-lettered).
GRANT SELECT, INSERT, DELETE ON urutan_dikembalikan TO :"worker_role";

-- Relay: the outbox (UPDATE: it locks rows FOR UPDATE and marks them sent;
-- DELETE: it purges sent rows).
GRANT SELECT, UPDATE, DELETE ON outbox TO :"relay_role";
-- Its id-range partitions (migration 0033): created ahead, detached and then
-- dropped whole (migration 0036) once every row is sent and older than
-- OUTBOX_RETENTION, the rows from before partitioning trimmed (SECURITY
-- DEFINER functions of the owner).
GRANT EXECUTE ON FUNCTION urutan_partisi_id_siapkan(BOOLEAN), urutan_partisi_id_buang(TEXT, INTERVAL),
    urutan_partisi_id_lepas(TEXT, INTERVAL), urutan_partisi_hapus(TEXT),
    urutan_awal_id_pangkas(TEXT, INTERVAL, INT) TO :"relay_role";

-- Producer: adds outbox rows, nothing else: with INSERT, or with
-- urutan_enqueue (SECURITY INVOKER: it inserts with the producer's own grant
-- and reads the default routing key's prefix from urutan_pengaturan).
-- INSERT on the columns a producer states only: the id, the times and the
-- relay's set-aside mark take their defaults (a planted id made another
-- producer's insert fail with a duplicate key; a planted dikirim_pada or
-- unroutable_at hid a row from the relay). A table-wide INSERT of an older
-- run of this script is taken back first. The outbox's CHECK constraints
-- (migration 0038) refuse, in the producer's own transaction, a row the
-- relay could not publish.
REVOKE INSERT ON outbox FROM :"producer_role";
GRANT INSERT (agregat_tipe, agregat_id, routing_key, payload, traceparent)
    ON outbox TO :"producer_role";
GRANT SELECT (id) ON outbox TO :"producer_role"; -- RETURNING id
GRANT USAGE ON SEQUENCE outbox_id_seq TO :"producer_role";
GRANT SELECT ON urutan_pengaturan TO :"producer_role";
GRANT EXECUTE ON FUNCTION urutan_enqueue(TEXT, TEXT, BIGINT, JSONB, TEXT) TO :"producer_role";

-- Operator (`urutan dlq`), only if named.
\if :{?operator_role}
SELECT NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'operator_role') AS missing \gset
\if :missing
CREATE ROLE :"operator_role" LOGIN;
\endif
\if :{?operator_password}
ALTER ROLE :"operator_role" PASSWORD :'operator_password';
\endif
GRANT CONNECT ON DATABASE :"dbname" TO :"operator_role";
GRANT USAGE ON SCHEMA :"schema" TO :"operator_role";
GRANT SELECT ON _sqlx_migrations TO :"operator_role";
-- Dead-letter records: read, added for a message found without one, and
-- resolved (and given the x-death they lacked); never what was recorded
-- about the message. A table-wide UPDATE of an older run of this script is
-- taken back first.
GRANT SELECT, INSERT ON urutan_dead_letter TO :"operator_role";
REVOKE UPDATE ON urutan_dead_letter FROM :"operator_role";
GRANT UPDATE (resolved_at, resolution, x_death) ON urutan_dead_letter TO :"operator_role";
GRANT USAGE ON SEQUENCE urutan_dead_letter_id_seq TO :"operator_role";
-- A dead-letter record ends the wait for a returned message (a trigger
-- deletes it from urutan_dikembalikan).
GRANT SELECT, DELETE ON urutan_dikembalikan TO :"operator_role";
-- `urutan hold list` and `urutan hold release` (the hold ends, recorded as a
-- skip); `urutan explain` reads what waits.
GRANT SELECT, DELETE ON urutan_tahan TO :"operator_role";
GRANT SELECT, INSERT ON urutan_lewati TO :"operator_role";
GRANT USAGE ON SEQUENCE urutan_lewati_seq_seq TO :"operator_role";
-- What a replayed message became: applied, stale, duplicate or parked.
GRANT SELECT ON pesanan, pesan_diproses, pesanan_riwayat, urutan_parkir TO :"operator_role";
-- `urutan explain`: stale arrivals.
GRANT SELECT ON urutan_basi TO :"operator_role";
-- `urutan explain` and `urutan status`: each version's epoch, the shards'
-- positions, the recorded ring and open windows (read only).
GRANT SELECT ON urutan_epoch, urutan_shard, urutan_ring, urutan_jendela TO :"operator_role";
-- `urutan status` and `urutan explain`: the outbox's backlog, its set-aside
-- rows and an order's unsent events (the operator reads dead-lettered
-- bodies already; the outbox holds the same events).
GRANT SELECT ON outbox TO :"operator_role";
-- Dead-lettered effects: listed and set pending again (`dlq --effects`):
-- their state, attempts and lease only, never what is sent (isi, message_id,
-- pesanan_id, versi, tujuan). A table-wide UPDATE of an older run of this
-- script is taken back first.
GRANT SELECT ON urutan_efek TO :"operator_role";
REVOKE UPDATE ON urutan_efek FROM :"operator_role";
GRANT UPDATE (keadaan, percobaan, coba_pada, sewa_sampai, sewa_oleh, selesai_pada)
    ON urutan_efek TO :"operator_role";
GRANT SELECT ON urutan_efek_tujuan TO :"operator_role";
-- `urutan hold release --effects`: a dead-lettered effect stops holding
-- its order (recorded as a skip, above) and the order is scheduled again.
GRANT UPDATE (ditahan_sejak) ON urutan_efek TO :"operator_role";
GRANT SELECT, INSERT, UPDATE ON urutan_efek_kepala TO :"operator_role";
-- `urutan console`: every action leaves an audit row (migration 0027).
GRANT SELECT, INSERT ON urutan_audit TO :"operator_role";
GRANT USAGE ON SEQUENCE urutan_audit_seq_seq TO :"operator_role";
\endif

-- Effects dispatcher (`urutan effects`), only if named.
\if :{?dispatcher_role}
SELECT NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'dispatcher_role') AS missing \gset
\if :missing
CREATE ROLE :"dispatcher_role" LOGIN;
\endif
\if :{?dispatcher_password}
ALTER ROLE :"dispatcher_role" PASSWORD :'dispatcher_password';
\endif
GRANT CONNECT ON DATABASE :"dbname" TO :"dispatcher_role";
GRANT USAGE ON SCHEMA :"schema" TO :"dispatcher_role";
GRANT SELECT ON _sqlx_migrations TO :"dispatcher_role";
-- Its EFFECTS setting, written at start: endpoints (INSERT ... ON CONFLICT
-- needs SELECT) and the routes in force (replaced whole).
GRANT SELECT, INSERT ON urutan_efek_tujuan TO :"dispatcher_role";
GRANT USAGE ON SEQUENCE urutan_efek_tujuan_tujuan_seq TO :"dispatcher_role";
GRANT SELECT, INSERT, DELETE ON urutan_efek_rute TO :"dispatcher_role";
-- Effects: claimed (FOR UPDATE SKIP LOCKED, UPDATE), settled, and purged
-- after EFFECTS_RETENTION: their state, attempts, lease and answer only,
-- never what is sent (isi, message_id, pesanan_id, versi, tujuan). A
-- table-wide UPDATE of an older run of this script is taken back first.
GRANT SELECT, DELETE ON urutan_efek TO :"dispatcher_role";
REVOKE UPDATE ON urutan_efek FROM :"dispatcher_role";
-- Its id-range partitions (migration 0033), as for the relay's outbox.
GRANT EXECUTE ON FUNCTION urutan_partisi_id_siapkan(BOOLEAN), urutan_partisi_id_buang(TEXT, INTERVAL),
    urutan_partisi_id_lepas(TEXT, INTERVAL), urutan_partisi_hapus(TEXT),
    urutan_awal_id_pangkas(TEXT, INTERVAL, INT) TO :"dispatcher_role";
-- ditahan_sejak: a dead letter that holds its order's later effects
-- (EFFECTS_ON_DEAD=hold).
GRANT UPDATE (keadaan, percobaan, coba_pada, sewa_sampai, sewa_oleh, selesai_pada, kode, jawaban,
              ditahan_sejak)
    ON urutan_efek TO :"dispatcher_role";
-- The schedule the claims and results keep (migration 0011): an order's
-- row is locked, moved to its due time, and deleted once nothing is pending.
GRANT SELECT, INSERT, UPDATE, DELETE ON urutan_efek_kepala TO :"dispatcher_role";
\endif

COMMIT;
