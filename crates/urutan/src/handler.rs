//! Your code in the apply transaction, written in Rust (docs/contract.md
//! section 10): the same contract as `HANDLER_FUNCTION`, for teams that
//! build their own `urutan` binary (see the `urutan-cli` crate's
//! `main_with` and `examples/stock`).
//!
//! For every version urutan applies (strict mode, batch mode, a parked or
//! set-aside message applied later) the worker calls
//! [`Handler::handle`] with the open transaction, after urutan's own state
//! and history rows are written and before commit; never for a `stale` or
//! `duplicate` delivery. What the handler writes on that transaction
//! commits with the dedup claim and the version fence, or not at all:
//! exactly once in effect.
//!
//! Its answer decides the message's fate (section 11):
//! - `Ok(())`: committed, acked.
//! - [`HandlerError::Retry`] (or a panic, or a lock or statement timeout,
//!   serialization failure or deadlock of its SQL): the transaction rolls
//!   back, the message is set aside and tried again later (after the
//!   duration it asked for, or `RETRY_BACKOFF_MIN`..`RETRY_BACKOFF_MAX`);
//!   the shard goes on with every other order.
//! - [`HandlerError::Refuse`] (or SQL that the database refuses as data):
//!   dead-lettered as `handler_refused`; with `ON_REFUSED=hold` its order
//!   is held until the message is replayed or the order released.
//! - a lost database connection: the shard waits and tries again, in order.
//!
//! ```
//! use urutan::handler::{Handler, HandlerError, HandlerEvent};
//!
//! struct Audit;
//!
//! impl Handler for Audit {
//!     fn handle<'a>(
//!         &'a self,
//!         tx: &'a mut sqlx::PgConnection,
//!         event: &'a HandlerEvent,
//!     ) -> futures::future::BoxFuture<'a, Result<(), HandlerError>> {
//!         Box::pin(async move {
//!             sqlx::query("INSERT INTO audit (order_id, versi) VALUES ($1, $2)")
//!                 .bind(&event.id)
//!                 .bind(event.versi)
//!                 .execute(&mut *tx)
//!                 .await?;
//!             Ok(())
//!         })
//!     }
//! }
//! ```

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde::Deserialize;

use crate::metrics::RetryReason;
use crate::store::StoreError;

/// One applied version, as the handler sees it (the JSON a
/// `HANDLER_FUNCTION` gets).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct HandlerEvent {
    pub message_id: String,
    /// The entity's id (the order's, by default).
    pub id: String,
    pub status: String,
    pub versi: i64,
    /// The message's `data`, if it had one.
    pub data: Option<serde_json::Value>,
    /// The version stored before this one (`None`: the entity is new).
    pub previous_versi: Option<i64>,
    /// The shard whose worker applies it.
    pub shard: u16,
}

/// Why the handler did not do its work: the message's fate.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// Transient: set the message aside and try it again later (after
    /// `after`, or the configured backoff).
    #[error("{error}")]
    Retry {
        error: String,
        after: Option<Duration>,
    },
    /// This version cannot be processed: dead-letter it (`handler_refused`).
    #[error("{0}")]
    Refuse(String),
    /// A database error of the handler's own SQL, judged like urutan's own
    /// (a lock or statement timeout, serialization failure or deadlock:
    /// retry; a data or integrity error: refuse; a lost connection: the
    /// shard waits).
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

impl HandlerError {
    /// Try again later, after the configured backoff.
    pub fn retry(error: impl std::fmt::Display) -> Self {
        Self::Retry {
            error: error.to_string(),
            after: None,
        }
    }

    /// Try again after `after`.
    pub fn retry_after(after: Duration, error: impl std::fmt::Display) -> Self {
        Self::Retry {
            error: error.to_string(),
            after: Some(after),
        }
    }

    /// Refuse this version: dead-lettered as `handler_refused`.
    pub fn refuse(error: impl std::fmt::Display) -> Self {
        Self::Refuse(error.to_string())
    }
}

/// A team's code, run in the apply transaction of every applied version.
pub trait Handler: Send + Sync + 'static {
    /// Does the work of `event` on `tx`, the open apply transaction. Must
    /// not commit or roll it back (a savepoint of its own is fine).
    fn handle<'a>(
        &'a self,
        tx: &'a mut sqlx::PgConnection,
        event: &'a HandlerEvent,
    ) -> BoxFuture<'a, Result<(), HandlerError>>;
}

/// A shared handler, as the worker keeps it.
pub type SharedHandler = Arc<dyn Handler>;

/// Calls `handler` with `event`'s JSON (as `urutan_tulis` left it in
/// `urutan.acara_terakhir`) on `tx`; its error, or its panic, becomes the
/// [`StoreError`] that decides the message's fate.
pub(crate) async fn call(
    handler: &dyn Handler,
    tx: &mut sqlx::PgConnection,
    event_json: Option<&str>,
) -> Result<(), StoreError> {
    let Some(json) = event_json else {
        return Err(StoreError::Retry {
            reason: RetryReason::HandlerRetry,
            error: "the applied version's event is missing (urutan.acara_terakhir)".into(),
            after: None,
        });
    };
    let event: HandlerEvent = serde_json::from_str(json).map_err(|e| StoreError::Retry {
        reason: RetryReason::HandlerRetry,
        error: format!("cannot read the applied version's event: {e}"),
        after: None,
    })?;
    let called = AssertUnwindSafe(handler.handle(tx, &event))
        .catch_unwind()
        .await;
    match called {
        Ok(Ok(())) => Ok(()),
        Ok(Err(HandlerError::Retry { error, after })) => Err(StoreError::Retry {
            reason: RetryReason::HandlerRetry,
            error,
            after,
        }),
        Ok(Err(HandlerError::Refuse(error))) => Err(StoreError::HandlerRefused(error)),
        Ok(Err(HandlerError::Database(e))) => Err(match StoreError::from(e) {
            // The handler's SQL broke a rule of the data: its refusal.
            StoreError::Refused(e) => {
                StoreError::HandlerRefused(format!("the handler refused: {e}"))
            }
            other => other,
        }),
        Err(panic) => Err(StoreError::Retry {
            reason: RetryReason::Panic,
            error: format!(
                "the handler panicked: {}",
                crate::shard::panic_message(panic.as_ref())
            ),
            after: None,
        }),
    }
}

impl StoreError {
    /// The SQLSTATE that stands for this failure in `urutan_lepas_gagal`
    /// (a handler's retry `URTRY`, its panic `URPNC`, its refusal `URREF`);
    /// `None` for a failure that is the database's own.
    pub(crate) fn sqlstate(&self) -> Option<String> {
        let code = |e: &sqlx::Error| match e {
            sqlx::Error::Database(db) => db.code().map(std::borrow::Cow::into_owned),
            _ => None,
        };
        match self {
            Self::Retry {
                reason: RetryReason::Panic,
                ..
            } => Some("URPNC".into()),
            Self::Retry { .. } => Some("URTRY".into()),
            Self::HandlerRefused(_) => Some("URREF".into()),
            Self::Refused(e) => Some(code(e).unwrap_or_else(|| "22000".into())),
            Self::Transient { source, .. } if self.sets_aside() => code(source),
            Self::Transient { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_event_reads_the_json_a_handler_function_gets() {
        let json = r#"{"message_id": "m-7", "id": "P-1", "status": "dibayar", "versi": 7,
                       "data": {"total": 5}, "previous_versi": 6, "shard": 3}"#;
        let event: HandlerEvent = serde_json::from_str(json).expect("event");
        assert_eq!(event.versi, 7);
        assert_eq!(event.previous_versi, Some(6));
        assert_eq!(event.shard, 3);
        assert_eq!(event.data, Some(serde_json::json!({"total": 5})));
        let new: HandlerEvent = serde_json::from_str(
            r#"{"message_id": "m-1", "id": "P-1", "status": "dibuat", "versi": 1,
                "data": null, "previous_versi": null, "shard": 0}"#,
        )
        .expect("new");
        assert_eq!((new.data, new.previous_versi), (None, None));
    }

    #[test]
    fn each_answer_maps_to_its_fate() {
        let retry = StoreError::Retry {
            reason: RetryReason::HandlerRetry,
            error: "busy".into(),
            after: Some(Duration::from_secs(3)),
        };
        assert!(retry.sets_aside());
        assert_eq!(retry.sqlstate().as_deref(), Some("URTRY"));
        assert_eq!(retry.retry_after(), Some(Duration::from_secs(3)));
        let panic = StoreError::Retry {
            reason: RetryReason::Panic,
            error: "boom".into(),
            after: None,
        };
        assert_eq!(panic.reason(), RetryReason::Panic);
        assert_eq!(panic.sqlstate().as_deref(), Some("URPNC"));
        let refused = StoreError::HandlerRefused("no".into());
        assert!(!refused.sets_aside());
        assert_eq!(refused.sqlstate().as_deref(), Some("URREF"));
        let lost = StoreError::from(sqlx::Error::PoolTimedOut);
        assert!(!lost.sets_aside());
        assert_eq!(lost.sqlstate(), None, "the database's own: the shard waits");
    }
}
