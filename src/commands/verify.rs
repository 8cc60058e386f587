//! `urutan verify`: checks the invariants from the database (and the
//! dead-letter queue's depth); a violation is exit code 1.

use anyhow::Context;
use lapin::options::QueueDeclareOptions;
use urutan::broker;
use urutan::config::Settings;
use urutan::store;

pub const HELP: &str = "\
Exit codes: 0 every check passed, 1 a violation (the offenders are listed).

Examples:
  urutan verify
  urutan verify || echo 'an invariant is broken'";

pub async fn run(settings: Settings) -> anyhow::Result<()> {
    // Before `prepare` migrates: with a forgotten DATABASE_SCHEMA or
    // ENTITY it would verify a new, empty pipeline and pass.
    let advice = match store::connect(&settings.database(), 1).await {
        Ok(db) => {
            let advice = urutan_ops::pipeline_advice(&db, &settings).await;
            db.close().await;
            advice
        }
        Err(_) => None, // `prepare` says why
    };
    if let Some(advice) = advice {
        return Err(urutan::heal::WrongSetting(advice).into());
    }
    let pool = store::prepare(&settings.database(), 2)
        .await
        .with_context(|| format!("cannot open {}", settings.database_url))?;
    let dlq = dead_letter_depth(&settings).await;
    let report = urutan_ops::verify::verify(&pool, dlq).await?;
    println!("{report}");
    anyhow::ensure!(report.passed(), "verification failed");
    Ok(())
}

/// Messages in the dead-letter queue, if the broker answers.
async fn dead_letter_depth(settings: &Settings) -> Option<u32> {
    let conn = broker::connect(&settings.broker(), "urutan verify")
        .await
        .ok()?;
    let ch = conn.create_channel().await.ok()?;
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let queue = settings.names().dead_letter_queue();
    let q = ch
        .queue_declare(queue.as_str().into(), passive, Default::default())
        .await
        .ok()?;
    let _ = broker::call("connection.close", conn.close(200, "done".into())).await;
    Some(q.message_count())
}
