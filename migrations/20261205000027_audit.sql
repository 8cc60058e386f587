-- Issue 34: every action taken in the console (`urutan console`) leaves an
-- audit row: who (the console's client, and whether it showed the token),
-- when, what, on which order, and the result. The console lists them, and
-- `urutan explain` shows an order's. Written only by the console; a row per
-- operator action, so it grows with people, not with traffic, and is kept.

CREATE TABLE IF NOT EXISTS urutan_audit (
    seq        BIGSERIAL PRIMARY KEY,
    pada       TIMESTAMPTZ NOT NULL DEFAULT now(),
    oleh       TEXT NOT NULL,
    tindakan   TEXT NOT NULL,
    pesanan_id TEXT,
    sasaran    TEXT NOT NULL,
    hasil      TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS urutan_audit_pesanan ON urutan_audit (pesanan_id, seq);

COMMENT ON TABLE urutan_audit IS 'Audit (audit) of operator actions taken in the console: when (pada), by whom (oleh: the client address and how it was admitted), the action (tindakan, e.g. hold_release), its order (pesanan_id), target (sasaran) and result (hasil). Shown by the console and urutan explain.';
