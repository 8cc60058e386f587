-- The recorded ring: the shard count the hash ring is meant to have, one row
-- per change (the row with the highest `versi` is current). Replicas started
-- with different SHARD_COUNTs (a rolling deploy) agree through it instead of
-- binding and unbinding shards against each other (see src/ring.rs).
CREATE TABLE IF NOT EXISTS urutan_ring (
    versi       BIGSERIAL PRIMARY KEY,
    -- Shards bound to the hash exchange after this change.
    shard_count INT NOT NULL CHECK (shard_count BETWEEN 1 AND 999),
    -- The count before the change (NULL: the first record).
    dari        INT CHECK (dari BETWEEN 1 AND 999),
    -- The epoch opened right after the bindings changed: once every shard
    -- has passed it, nothing routed by the old ring is left anywhere.
    epoch       BIGINT NOT NULL,
    -- Who asked for it (command, host, pid), for the refusal messages.
    oleh        TEXT NOT NULL,
    mulai       TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- When the old ring's messages were all done and removed shards deleted
    -- (NULL while the resharding is in progress).
    selesai     TIMESTAMPTZ
);

-- Set (under the publish pause) right before a ring change touches the
-- bindings, cleared once the epoch after it is open. If the process making
-- the change dies in between, the pause ends with its session, and the next
-- relay batch finds the flag and opens the epoch itself before publishing
-- anything: new-ring messages never get in ahead of a marker.
CREATE TABLE IF NOT EXISTS urutan_ring_berubah (
    satu  BOOLEAN PRIMARY KEY DEFAULT true CHECK (satu),
    sejak TIMESTAMPTZ NOT NULL DEFAULT now()
);
