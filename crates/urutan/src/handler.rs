//! Your code in the apply transaction, written in Rust (docs/contract.md
//! section 10): the same contract as `HANDLER_FUNCTION`. Implement
//! [`Handler`] with an `async fn` and hand it to [`crate::Pool`] (or to
//! the `urutan-cli` crate's `main_with`, for a binary with every `urutan`
//! command; see `examples/stock`).
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
//! - [`HandlerError::Refuse`] (or SQL that the database refuses as data,
//!   or `data` that [`HandlerEvent::data_as`] cannot read): dead-lettered
//!   as `handler_refused`; with `ON_REFUSED=hold` its order is held until
//!   the message is replayed or the order released.
//! - a lost database connection: the shard waits and tries again, in order.
//!
//! ```
//! use urutan::handler::{Handler, HandlerError, HandlerEvent};
//!
//! struct Audit;
//!
//! impl Handler for Audit {
//!     async fn handle(
//!         &self,
//!         tx: &mut sqlx::PgConnection,
//!         event: &HandlerEvent,
//!     ) -> Result<(), HandlerError> {
//!         sqlx::query("INSERT INTO audit (order_id, versi) VALUES ($1, $2)")
//!             .bind(&event.id)
//!             .bind(event.versi)
//!             .execute(tx)
//!             .await?;
//!         Ok(())
//!     }
//! }
//! ```

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde::Deserialize;
use serde::de::DeserializeOwned;

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

impl HandlerEvent {
    /// The event's `data` read as `T` (a missing `data` reads as JSON
    /// `null`, so `Option<T>` accepts it). Data that does not fit `T` is
    /// the version's fault, not the handler's: the error is a
    /// [`HandlerError::Refuse`] naming the entity, the version, `T` and
    /// what did not fit, so `?` dead-letters the version as
    /// `handler_refused` with that reason.
    ///
    /// ```
    /// # use urutan::handler::HandlerEvent;
    /// #[derive(serde::Deserialize)]
    /// struct Paid {
    ///     total: i64,
    /// }
    /// # let event: HandlerEvent = serde_json::from_str(r#"{"message_id": "m-1", "id": "P-1",
    /// #   "status": "dibayar", "versi": 2, "data": {"total": 5}, "previous_versi": 1, "shard": 0}"#).unwrap();
    /// let paid: Paid = event.data_as()?;
    /// assert_eq!(paid.total, 5);
    /// # Ok::<(), urutan::handler::HandlerError>(())
    /// ```
    pub fn data_as<T: DeserializeOwned>(&self) -> Result<T, HandlerError> {
        let null = serde_json::Value::Null;
        T::deserialize(self.data.as_ref().unwrap_or(&null)).map_err(|e| {
            let wanted = std::any::type_name::<T>();
            // `my_crate::orders::Paid` reads as `Paid`; generics stay whole.
            let wanted = match wanted.split_once('<') {
                None => wanted.rsplit("::").next().unwrap_or(wanted),
                Some(_) => wanted,
            };
            HandlerError::refuse(format!(
                "{} v{} ({}): data does not fit {wanted}: {e}",
                self.id, self.versi, self.message_id
            ))
        })
    }
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
///
/// Implement it with an `async fn` (the future must be `Send`: the workers
/// run on a multi-threaded runtime); urutan keeps it as a
/// [`SharedHandler`].
pub trait Handler: Send + Sync + 'static {
    /// Does the work of `event` on `tx`, the open apply transaction. Must
    /// not commit or roll it back (a savepoint of its own is fine).
    fn handle(
        &self,
        tx: &mut sqlx::PgConnection,
        event: &HandlerEvent,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send;
}

/// The dyn-compatible form of a [`Handler`], as the workers call it:
/// implemented for every `Handler` (there is no need to implement it
/// yourself).
pub trait DynHandler: Send + Sync + 'static {
    /// [`Handler::handle`], boxed.
    fn handle_boxed<'a>(
        &'a self,
        tx: &'a mut sqlx::PgConnection,
        event: &'a HandlerEvent,
    ) -> BoxFuture<'a, Result<(), HandlerError>>;
}

impl<H: Handler> DynHandler for H {
    fn handle_boxed<'a>(
        &'a self,
        tx: &'a mut sqlx::PgConnection,
        event: &'a HandlerEvent,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(self.handle(tx, event))
    }
}

/// A shared handler, as the worker keeps it (`Arc::new(handler)` is one).
pub type SharedHandler = Arc<dyn DynHandler>;

/// Calls `handler` with `event`'s JSON (as `urutan_tulis` left it in
/// `urutan.acara_terakhir`) on `tx`; its error, or its panic, becomes the
/// [`StoreError`] that decides the message's fate.
pub(crate) async fn call(
    handler: &dyn DynHandler,
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
    let called = AssertUnwindSafe(handler.handle_boxed(tx, &event))
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
    fn data_that_does_not_fit_is_refused_with_what_did_not_fit() {
        #[derive(Debug, Deserialize)]
        struct Paid {
            #[allow(dead_code)]
            total: i64,
        }
        let event: HandlerEvent = serde_json::from_str(
            r#"{"message_id": "m-7", "id": "P-1", "status": "dibayar", "versi": 7,
                "data": {"sum": 5}, "previous_versi": 6, "shard": 3}"#,
        )
        .expect("event");
        let Err(HandlerError::Refuse(why)) = event.data_as::<Paid>() else {
            panic!("refused");
        };
        assert_eq!(
            why,
            "P-1 v7 (m-7): data does not fit Paid: missing field `total`"
        );
        let none = HandlerEvent {
            data: None,
            ..event
        };
        assert!(matches!(none.data_as::<Option<Paid>>(), Ok(None)));
        assert!(matches!(
            none.data_as::<Paid>(),
            Err(HandlerError::Refuse(why)) if why.contains("invalid type: null")
        ));
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
