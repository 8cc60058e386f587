-- The stock team's own tables (in the pipeline's schema, beside urutan's).
-- urutan-stock's handler writes them in the apply transaction of every
-- applied version of an order: exactly once in effect.

-- Stock on hand per SKU; never negative.
CREATE TABLE IF NOT EXISTS stok (
    sku      TEXT PRIMARY KEY,
    tersedia BIGINT NOT NULL CHECK (tersedia >= 0)
);

-- What each order holds: reserved when it is created (`dibuat`), given
-- back when it is cancelled (`dibatalkan`).
CREATE TABLE IF NOT EXISTS reservasi (
    pesanan_id TEXT NOT NULL,
    sku        TEXT NOT NULL REFERENCES stok (sku),
    jumlah     BIGINT NOT NULL CHECK (jumlah > 0),
    PRIMARY KEY (pesanan_id, sku)
);

-- One charge per paid order (`dibayar`), refunded on cancellation.
CREATE TABLE IF NOT EXISTS tagihan (
    pesanan_id TEXT NOT NULL,
    versi      BIGINT NOT NULL,
    jumlah     BIGINT NOT NULL,
    PRIMARY KEY (pesanan_id, versi)
);
