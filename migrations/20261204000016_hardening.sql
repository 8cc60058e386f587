-- Issue 29 (low): every SECURITY DEFINER function of this schema searches
-- this schema and then pg_temp, nothing else. With `SET search_path FROM
-- CURRENT` (`"$user", public` when migrated), pg_temp came FIRST for
-- relations: a caller's temporary table named like one the function reads
-- (e.g. `urutan_efek_rute`) would have been read with the owner's rights.
-- pg_temp last is what the PostgreSQL manual asks of such functions.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.prosecdef AND p.pronamespace = current_schema()::regnamespace
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
    END LOOP;
END
$$;
