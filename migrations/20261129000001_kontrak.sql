-- The contract's tables (contract.md section 4).

-- Current state of each order: one row per entity, only ever moved forward by versi.
CREATE TABLE IF NOT EXISTS pesanan (
    id              TEXT PRIMARY KEY,
    status          TEXT NOT NULL,
    versi           BIGINT NOT NULL,
    data            JSONB,
    diperbarui_pada TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Deduplication: every message id that was processed (applied or stale).
CREATE TABLE IF NOT EXISTS pesan_diproses (
    message_id    TEXT PRIMARY KEY,
    diproses_pada TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS pesan_diproses_diproses_pada_idx ON pesan_diproses (diproses_pada);

-- One row per applied version, in apply order (seq).
CREATE TABLE IF NOT EXISTS pesanan_riwayat (
    seq             BIGSERIAL PRIMARY KEY,
    pesanan_id      TEXT NOT NULL,
    versi           BIGINT NOT NULL,
    status          TEXT NOT NULL,
    message_id      TEXT NOT NULL,
    shard           INT NOT NULL,
    diterapkan_pada TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (pesanan_id, versi)
);

-- Transactional outbox written by producers, drained by `urutan relay`.
CREATE TABLE IF NOT EXISTS outbox (
    id           BIGSERIAL PRIMARY KEY,
    agregat_tipe TEXT NOT NULL,
    agregat_id   TEXT NOT NULL,
    routing_key  TEXT NOT NULL,
    payload      JSONB NOT NULL,
    dibuat_pada  TIMESTAMPTZ NOT NULL DEFAULT now(),
    dikirim_pada TIMESTAMPTZ
);
CREATE INDEX IF NOT EXISTS outbox_unsent_idx ON outbox (id) WHERE dikirim_pada IS NULL;
