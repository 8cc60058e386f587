//! What heals and what does not (docs/contract.md section 6).
//!
//! - A failure no retry can fix (a refused login, an unknown vhost or
//!   database, a permission refusal) is an [`Unhealable`]: one line naming
//!   the setting, its URL with the password masked, what the service said
//!   and the fix. At start it stops the command (exit code 2).
//! - A failure that can pass (connection refused, a timeout, a broker
//!   restarting) is retried, and logged as one line per change of the
//!   service's state ([`Outage`]), never one per attempt: "unreachable
//!   (connection refused); retrying" once, then "reachable again".

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tracing::{info, warn};

use crate::broker::BrokerError;
use crate::broker::reply::amqp_reply_code;
use crate::config::{BrokerUrls, SecretUrl};

/// A failure no retry can fix, as one line: `SETTING url: what the service
/// said: the fix`. The URL is printed with its password masked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{setting} {url}: {said}: {fix}")]
pub struct Unhealable {
    /// The setting to change (`AMQP_URL`, `DATABASE_URL`).
    pub setting: &'static str,
    /// Its value, password masked.
    pub url: String,
    /// What the service answered, in its own words (one line).
    pub said: String,
    /// What to do about it.
    pub fix: String,
}

impl Unhealable {
    /// The database's refusal in `e`, if it is one no retry can fix:
    /// 28P01 (wrong password), 28000 (unknown role, no `pg_hba.conf` entry),
    /// 3D000 (no such database), 42501 (permission denied), or a
    /// configuration error (pending migrations this role may not apply).
    pub fn database(url: &SecretUrl, e: &sqlx::Error) -> Option<Self> {
        let (said, fix) = match e {
            sqlx::Error::Database(db) => {
                let fix = match db.code().as_deref()? {
                    "28P01" => "check the user and password",
                    "28000" => "check the user (and the server's pg_hba.conf)",
                    "3D000" => "create it with `urutan migrate --create-database`, or fix the name",
                    "42501" => {
                        "grant this role what it needs (deploy/postgres/), or run `urutan migrate` \
                         as the database owner"
                    }
                    _ => return None,
                };
                (one_line(db.message()), fix)
            }
            sqlx::Error::Configuration(why) => (one_line(&why.to_string()), "fix DATABASE_URL"),
            _ => return None,
        };
        Some(Self {
            setting: "DATABASE_URL",
            url: url.to_string(),
            said,
            fix: fix.to_owned(),
        })
    }

    /// The broker's refusal in `e`, if it is one no retry can fix: 403
    /// ACCESS_REFUSED (a refused login, or no access to the vhost) and 530
    /// NOT_ALLOWED (an unknown vhost) when connecting.
    pub fn broker(nodes: &BrokerUrls, e: &BrokerError) -> Option<Self> {
        let BrokerError::Amqp(e) = e else {
            return None;
        };
        let lapin::ErrorKind::ProtocolError(amqp) = e.kind() else {
            return None;
        };
        let said = one_line(amqp.get_message().as_str())
            .trim_end_matches('.')
            .to_owned();
        let fix = match amqp_reply_code(e)? {
            530 => "create the vhost or fix the path in AMQP_URL (%2f is the vhost /)",
            403 if said.contains("vhost") => {
                "create the vhost or fix the path in AMQP_URL, and give the user access to it \
                 (rabbitmqctl set_permissions)"
            }
            403 if said.contains("Login") || said.contains("login") => {
                "check the user and password"
            }
            403 => {
                "give the broker user the permissions it needs in this vhost \
                 (deploy/rabbitmq/least-privilege.sh)"
            }
            _ => return None,
        };
        Some(Self {
            setting: "AMQP_URL",
            url: nodes.to_string(),
            said,
            fix: fix.to_owned(),
        })
    }
}

/// A setting that is malformed or names what does not exist (one line
/// naming it and the fix): no retry can fix it either.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct WrongSetting(pub String);

/// `text` without the PostgreSQL source line sqlx appends to a database
/// error's message (" at line 768": a line of the server's C code, no help
/// to anyone reading the error).
pub fn without_source_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(" at line ") {
        let after = &rest[at + " at line ".len()..];
        let digits = after.chars().take_while(char::is_ascii_digit).count();
        let ends = after[digits..]
            .chars()
            .next()
            .is_none_or(|c| !c.is_alphanumeric());
        if digits > 0 && ends {
            out.push_str(&rest[..at]);
            rest = &after[digits..];
        } else {
            out.push_str(&rest[..at + 1]);
            rest = &rest[at + 1..];
        }
    }
    out.push_str(rest);
    out
}

/// `text` without the PL/pgSQL context PostgreSQL appends ("PL/pgSQL
/// function … at line 768"), on one line.
pub fn one_line(text: &str) -> String {
    let first = text.lines().next().unwrap_or_default().trim();
    first.to_owned()
}

/// A short cause of a broker failure for [`Outage::failed`]: "connection
/// refused", "timed out", the broker's reply text, ...
pub fn broker_cause(e: &BrokerError) -> String {
    match e {
        BrokerError::Amqp(e) => match e.kind() {
            lapin::ErrorKind::IOError(io) => io_cause(io),
            lapin::ErrorKind::ProtocolError(amqp) => one_line(amqp.get_message().as_str()),
            _ => one_line(&e.to_string()),
        },
        BrokerError::Timeout(_) | BrokerError::HandshakeTimeout { .. } => "timed out".into(),
        other => one_line(&other.to_string()),
    }
}

/// A short cause of a database failure for [`Outage::failed`].
pub fn database_cause(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Io(io) => io_cause(io),
        sqlx::Error::PoolTimedOut => "no connection within the pool's timeout".into(),
        sqlx::Error::Database(db) => one_line(db.message()),
        other => one_line(&other.to_string()),
    }
}

fn io_cause(io: &std::io::Error) -> String {
    use std::io::ErrorKind as K;
    match io.kind() {
        K::ConnectionRefused => "connection refused".into(),
        K::TimedOut => "timed out".into(),
        K::ConnectionReset | K::ConnectionAborted | K::UnexpectedEof => "connection closed".into(),
        _ => one_line(&io.to_string()),
    }
}

/// A service's state as logged: one line when it becomes unreachable (or
/// fails for another reason), one when it is reachable again. Shared by
/// every task of the process that talks to the same service
/// ([`outage`]), so a broker down for the pool and four shards is still
/// one line.
#[derive(Debug)]
pub struct Outage {
    /// What is named in the lines: `broker 127.0.0.1:5672`.
    service: String,
    /// The cause last logged while it is down.
    down: Mutex<Option<String>>,
}

impl Outage {
    /// An attempt failed with `cause`: logged if the service was up, or
    /// failed for another cause until now.
    pub fn failed(&self, cause: &str) {
        let mut down = self.down.lock().unwrap_or_else(|e| e.into_inner());
        if down.as_deref() != Some(cause) {
            warn!("{} unreachable ({cause}); retrying", self.service);
            *down = Some(cause.to_owned());
        }
    }

    /// An attempt succeeded: logged if the service was down.
    pub fn recovered(&self) {
        let mut down = self.down.lock().unwrap_or_else(|e| e.into_inner());
        if down.take().is_some() {
            info!("{} reachable again", self.service);
        }
    }
}

/// The process's one [`Outage`] of `service` (`broker 127.0.0.1:5672`,
/// `database 127.0.0.1:5432`).
pub fn outage(service: String) -> Arc<Outage> {
    static ALL: Mutex<Option<HashMap<String, Arc<Outage>>>> = Mutex::new(None);
    let mut all = ALL.lock().unwrap_or_else(|e| e.into_inner());
    let all = all.get_or_insert_with(HashMap::new);
    all.entry(service.clone())
        .or_insert_with(|| {
            Arc::new(Outage {
                service,
                down: Mutex::new(None),
            })
        })
        .clone()
}

/// The broker's [`Outage`], named by its nodes' `host:port`.
pub fn broker_outage(nodes: &BrokerUrls) -> Arc<Outage> {
    outage(format!("broker {}", nodes.addresses()))
}

/// The database's [`Outage`], named by its `host:port`.
pub fn database_outage(url: &SecretUrl) -> Arc<Outage> {
    outage(format!("database {}", url.address()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plpgsql_context_is_not_shown() {
        let text = "column \"x\" does not exist\nCONTEXT: PL/pgSQL function f() at line 768";
        assert_eq!(one_line(text), "column \"x\" does not exist");
    }

    #[test]
    fn the_server_source_line_is_not_shown() {
        let text = "relation \"x\" does not exist at line 1452: more";
        assert_eq!(
            without_source_line(text),
            "relation \"x\" does not exist: more"
        );
        assert_eq!(without_source_line("at line 5"), "at line 5");
        assert_eq!(
            without_source_line("the order at line 5b"),
            "the order at line 5b"
        );
    }

    #[test]
    fn configuration_errors_name_the_setting_masked() {
        let url: SecretUrl = "postgres://app:pw-secret@db:5432/urutan"
            .parse()
            .expect("url");
        let e = sqlx::Error::Configuration("2 migration(s) pending".into());
        let line = Unhealable::database(&url, &e)
            .expect("unhealable")
            .to_string();
        assert!(
            line.starts_with("DATABASE_URL postgres://app:***@db:5432/urutan: "),
            "{line}"
        );
        assert!(!line.contains("pw-secret"), "{line}");
        assert!(Unhealable::database(&url, &sqlx::Error::PoolTimedOut).is_none());
    }
}
