-- Issue 34: the effects not sent (pending and dead-lettered) by endpoint,
-- for the console's effects page and `urutan status`, read without reading
-- the sent ones: those are kept for EFFECTS_RETENTION and outnumber the
-- rest by far (one row per applied version and endpoint).
CREATE INDEX IF NOT EXISTS urutan_efek_terbuka
    ON urutan_efek (keadaan, tujuan) WHERE keadaan <> 'terkirim';
COMMENT ON INDEX urutan_efek_terbuka IS 'Effects not sent (pending and dead-lettered) by state and endpoint: the effects by endpoint (the console) and the dead-lettered ones (urutan status, dlq list --effects), past the sent ones kept for EFFECTS_RETENTION.';
