//! Before a command does anything: may it log in where it needs to? A
//! refused login, an unknown vhost or database, a permission refusal stop
//! it at once (docs/contract.md section 6: exit code 2, one line naming
//! the setting and the fix). A service that cannot be reached is no
//! verdict: the command goes on and retries, or reports it, as it does.

use std::time::Duration;

use sqlx::Connection;
use urutan::broker;
use urutan::config::Settings;
use urutan::heal::{Unhealable, WrongSetting};

/// How long each look may take; longer counts as "cannot tell yet".
const LOOK: Duration = Duration::from_secs(4);

/// What a command talks to.
#[derive(Debug, Clone, Copy)]
pub struct Needs {
    pub database: bool,
    pub broker: bool,
    /// How much of the pipeline the database holds its settings must name.
    pub pipeline: Pipeline,
}

/// What `ENTITY` and `DATABASE_SCHEMA` must agree with (see
/// [`urutan::store::pipeline`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pipeline {
    /// Nothing checked (reports say it themselves).
    Unchecked,
    /// The schema's pipeline, if it holds state, is of this `ENTITY`
    /// (`urutan migrate`).
    Entity,
    /// That, and no other schema holds this entity's pipeline when this
    /// one holds none (a pool, a relay).
    Whole,
}

/// Logs in to what `needs` names, once, and says no when a service refuses
/// in a way no retry can change, or when `ENTITY`/`DATABASE_SCHEMA` name
/// another pipeline than the database holds ([`WrongSetting`]).
pub async fn check(settings: &Settings, needs: Needs, command: &str) -> anyhow::Result<()> {
    if needs.database {
        let url = settings.database();
        let look = sqlx::PgConnection::connect(url.expose());
        if let Ok(answer) = tokio::time::timeout(LOOK, look).await {
            match answer {
                Ok(mut conn) => {
                    let refusal = match needs.pipeline {
                        Pipeline::Unchecked => None,
                        how => pipeline_refusal(&mut conn, settings, how).await,
                    };
                    let _ = tokio::time::timeout(LOOK, conn.close()).await;
                    if let Some(refusal) = refusal {
                        return Err(WrongSetting(refusal).into());
                    }
                }
                Err(e) => {
                    if let Some(refused) = Unhealable::database(&settings.database_url, &e) {
                        return Err(refused.into());
                    }
                }
            }
        }
    }
    if needs.broker {
        // Each node in turn until one answers (lapin directly: the login
        // check is no connection worth a log line).
        let nodes = settings.broker();
        let name = format!("urutan {command} (login check)");
        for node in nodes.nodes() {
            let props =
                lapin::ConnectionProperties::default().with_connection_name(name.as_str().into());
            let look = lapin::Connection::connect(node.expose(), props);
            let Ok(answer) = tokio::time::timeout(LOOK, look).await else {
                continue;
            };
            match answer {
                Ok(conn) => {
                    let _ =
                        broker::call("connection.close", conn.close(200, "checked".into())).await;
                    break;
                }
                Err(e) => {
                    let e = broker::BrokerError::Amqp(e);
                    if let Some(refused) = Unhealable::broker(&settings.amqp_url, &e) {
                        return Err(refused.into());
                    }
                }
            }
        }
    }
    Ok(())
}

/// Why these settings must not start a pool or a relay on this database
/// (one line naming the setting), if the look answers in time.
async fn pipeline_refusal(
    conn: &mut sqlx::PgConnection,
    settings: &Settings,
    how: Pipeline,
) -> Option<String> {
    let look = urutan::store::pipeline::look(conn, settings);
    match tokio::time::timeout(LOOK, look).await {
        Ok(Ok(found)) if how == Pipeline::Whole => found.refusal(),
        Ok(Ok(found)) => found.entity_refusal(),
        _ => None,
    }
}
