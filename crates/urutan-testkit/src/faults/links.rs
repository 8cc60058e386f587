//! The run's network links: on a single broker, every process of the fleet
//! reaches the broker and the database through a fault-injecting TCP proxy
//! (`urutan_testkit::proxy`), so the suite can make the wire fail silently
//! (blackhole: packets vanish, sockets stay open) or slowly (added latency).
//! The suite's own checks and probes connect directly.
//!
//! In pair mode (`FAULTS_PG_PAIR`) the database is reached through
//! [`DbName`], a proxy in the role of the managed service's DNS name: the
//! suite and the database link's proxy both connect to it, and a failover
//! moves it to the promoted standby.

use std::net::SocketAddr;

use anyhow::Context;

use crate::faults::services::Services;
use crate::proxy::Proxy;

/// A proxy in front of the broker and one in front of the database.
pub struct Links {
    pub broker: Proxy,
    pub database: Proxy,
}

/// `host:port` of a URL (`amqp://u:p@h:5672/vh`, `postgres://u@h:5432/db`).
fn addr_of(url: &str) -> anyhow::Result<SocketAddr> {
    let url = url::Url::parse(url).with_context(|| format!("not a URL: {url}"))?;
    let host = url.host_str().context("no host")?;
    let port = url.port().context("no port")?;
    let host = if host == "localhost" {
        "127.0.0.1"
    } else {
        host
    };
    format!("{host}:{port}")
        .parse()
        .with_context(|| format!("{host}:{port} is not an IP address and port"))
}

/// `url` with its port replaced by the proxy's (the host is loopback).
fn through(url: &str, proxy: &Proxy) -> anyhow::Result<String> {
    let mut url = url::Url::parse(url)?;
    url.set_host(Some("127.0.0.1"))?;
    url.set_port(Some(proxy.addr.port()))
        .map_err(|()| anyhow::anyhow!("cannot set a port on {url}"))?;
    Ok(url.to_string())
}

impl Links {
    /// Proxies for `amqp_url` (one node) and `database_url`.
    pub async fn start(amqp_url: &str, database_url: &str) -> anyhow::Result<Self> {
        Ok(Self {
            broker: Proxy::start(addr_of(amqp_url)?).await,
            database: Proxy::start(addr_of(database_url)?).await,
        })
    }

    /// The URLs the fleet uses: through the proxies.
    pub fn urls(&self, amqp_url: &str, database_url: &str) -> anyhow::Result<(String, String)> {
        Ok((
            through(amqp_url, &self.broker)?,
            through(database_url, &self.database)?,
        ))
    }
}

/// The database's name in pair mode: a proxy to the current primary, as a
/// managed PostgreSQL service's DNS name (no faults of its own; the fleet's
/// link to it goes through [`Links::database`]).
pub struct DbName {
    proxy: Proxy,
}

impl DbName {
    /// Brings the pair up in synchronous mode (a no-op if it runs healthy)
    /// and points the name at its primary.
    pub async fn start(services: &Services) -> anyhow::Result<Self> {
        services
            .pair(&["up", "--sync"])
            .await
            .context("bring the database pair up (pair.sh up --sync)")?;
        let primary = primary(services).await?;
        Ok(Self {
            proxy: Proxy::start(primary).await,
        })
    }

    /// `services` with the database base URL through this name.
    pub fn services(&self, services: &Services) -> Services {
        let mut through = services.clone();
        through.place.pg_base = format!("postgres://postgres@{}", self.proxy.addr);
        through
    }

    /// Points the name at the current primary and closes the connections
    /// made through it before (the old primary's are gone anyway; a real
    /// failover leaves none to a node that is no longer the primary).
    /// Returns the primary's address.
    pub async fn follow(&self, services: &Services) -> anyhow::Result<SocketAddr> {
        let primary = primary(services).await?;
        self.proxy.retarget(primary);
        self.proxy.cut_open();
        Ok(primary)
    }
}

/// The pair's current primary (`pair.sh primary-port`), on loopback.
pub async fn primary(services: &Services) -> anyhow::Result<SocketAddr> {
    let port = services.pair(&["primary-port"]).await?;
    let port: u16 =
        (port.trim().parse()).with_context(|| format!("pair.sh primary-port said {port:?}"))?;
    Ok(SocketAddr::from(([127, 0, 0, 1], port)))
}
