//! The outbox relay's retention: sent rows past `OUTBOX_RETENTION` go, in
//! batches, through the store's one purge loop; unsent and recent rows stay.
//! (Processed ids: `poison::retention_purges_only_expired_ids`; dead-letter
//! records: `dlq::unresolved_dead_letters_expire_after_their_retention`.)

use std::time::Duration;

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_purges_only_sent_rows_past_their_retention() {
    let env = TestEnv::new("outbox_retention").await;
    let db = env.db().await;
    let seed = "INSERT INTO outbox (agregat_tipe, agregat_id, routing_key, payload, dikirim_pada)
        SELECT 'pesanan', 'old-' || g, 'pesanan.x', '{}'::jsonb, now() - interval '8 days'
          FROM generate_series(1, 12000) g
        UNION ALL
        SELECT 'pesanan', 'edge-' || g, 'pesanan.x', '{}'::jsonb, now() - interval '6 days 23 hours'
          FROM generate_series(1, 100) g
        UNION ALL
        SELECT 'pesanan', 'unsent-' || g, 'pesanan.x', '{}'::jsonb, NULL FROM generate_series(1, 50) g";
    sqlx::query(seed).execute(&db).await.expect("seed");
    // An old row never sent (say, unroutable for a week) is not the relay's
    // to delete.
    sqlx::query(
        "UPDATE outbox SET dibuat_pada = now() - interval '30 days' WHERE dikirim_pada IS NULL",
    )
    .execute(&db)
    .await
    .expect("age the unsent rows");

    let retention = Duration::from_secs(7 * 86_400);
    let mut conn = db.acquire().await.expect("connection");
    let purged = tokio::time::timeout(
        Duration::from_secs(60),
        urutan::outbox::relay::purge_sent(&mut conn, retention),
    )
    .await
    .expect("purge within 60 s")
    .expect("purge");
    assert_eq!(
        purged, 12_000,
        "every sent row past the retention, over three batches"
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM outbox WHERE agregat_id LIKE 'old-%'"
        )
        .await,
        0
    );
    assert_eq!(
        count(&db, "SELECT count(*) FROM outbox").await,
        150,
        "rows sent within the retention and unsent rows stay"
    );
    let again = urutan::outbox::relay::purge_sent(&mut conn, retention)
        .await
        .expect("second purge");
    assert_eq!(again, 0);
}
