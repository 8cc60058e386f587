//! The run's network links: on a single broker, every process of the fleet
//! reaches the broker and the database through a fault-injecting TCP proxy
//! (`tests/it/proxy.rs`), so the suite can make the wire fail silently
//! (blackhole: packets vanish, sockets stay open) or slowly (added latency).
//! The suite's own checks and probes connect directly.

use std::net::SocketAddr;

use anyhow::Context;

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
