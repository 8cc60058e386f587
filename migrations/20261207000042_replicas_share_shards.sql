-- Replicas of the pipeline share its shards (issue 45, docs/contract.md
-- section 13). Each `urutan run` keeps a row in `urutan_replika` with a lease
-- it renews every second; a replica whose lease ran out is dead to the
-- others. `urutan_penempatan` says which live replica is active on each
-- shard. Both are written only by the replicas' own membership transaction
-- (crates/urutan/src/replica), one at a time under one advisory lock, which
-- recomputes the placement from the live replicas and the placement in
-- force (moving only what must move).

CREATE TABLE urutan_replika (
    nama TEXT PRIMARY KEY,
    bergabung_pada TIMESTAMPTZ NOT NULL DEFAULT now(),
    sewa_sampai TIMESTAMPTZ NOT NULL,
    aktif INT[] NOT NULL DEFAULT '{}',
    hidup_pid INT
);

COMMENT ON TABLE urutan_replika IS
    'One row per live replica (`urutan run`) of the pipeline: `nama` (REPLICA_NAME), '
    '`bergabung_pada` (joined at), `sewa_sampai` (lease until: renewed every second, '
    'the replica is dead to the others after it), `aktif` (the shards it has a '
    'registered consumer on, as it last reported), `hidup_pid` (alive: the backend '
    'of the replica''s own connection holding its life lock; when that lock is gone '
    'the replica is dead at once, without waiting for the lease). A replica stopping gracefully '
    'deletes its row; an expired row is deleted by the next replica that renews.';

CREATE TABLE urutan_penempatan (
    shard INT PRIMARY KEY,
    replika TEXT NOT NULL,
    alasan TEXT NOT NULL CHECK (alasan IN ('joined', 'left', 'lost', 'rebalanced')),
    sejak TIMESTAMPTZ NOT NULL DEFAULT now()
);

COMMENT ON TABLE urutan_penempatan IS
    'Placement: the replica active on each shard (`replika`), why it got it '
    '(`alasan`: joined, left, lost, rebalanced) and since when (`sejak`). The old '
    'owner settles what it holds and cancels its consumer before the new one '
    'takes any delivery (the shard''s handover lock).';
