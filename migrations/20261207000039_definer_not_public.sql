-- Every SECURITY DEFINER function runs with its owner's rights: no role may
-- call one unless it is granted (issue 43: `urutan_epoch_pangkas`, callable by
-- every role, let a producer delete 59 of 60 epochs).
--
-- PostgreSQL grants EXECUTE on a new function to PUBLIC. Earlier migrations
-- revoked it function by function and missed some; this one revokes it from
-- every SECURITY DEFINER function of the schema, read from the catalog, and
-- tests/it/privilege.rs fails on any that PUBLIC can still run.
-- deploy/postgres/least-privilege.sql grants each to the roles that call it:
--   urutan_efek_aktif      the worker (its apply asks whether effects are on)
--   urutan_epoch_pangkas   the worker and the relay (every epoch they open prunes)
-- Trigger functions need no grant: EXECUTE is checked when a trigger is
-- created, not when it fires. The partition helpers were revoked before
-- (migrations 0026, 0033, 0036) and are granted there already.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.prosecdef AND p.pronamespace = current_schema()::regnamespace
    LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;
