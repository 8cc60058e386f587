//! Every consumer of each shard queue, standbys included.
//!
//! A passive `queue.declare` on a single-active-consumer quorum queue counts
//! only the active consumer (measured on RabbitMQ 3.10: two replicas
//! consuming, `consumer_count` 1, `rabbitmqctl list_queues consumers` 2), so
//! AMQP alone cannot tell how many replicas stand by. The broker's
//! Prometheus endpoint (plugin `rabbitmq_prometheus`, which
//! `deploy/local/setup.sh` enables) can: `/metrics/detailed?family=
//! queue_consumer_count` has `rabbitmq_detailed_queue_consumers` per queue.
//! Without that endpoint, the number of replicas is simply unknown.

use std::collections::HashMap;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use urutan::config::BrokerUrls;

/// How long the endpoint may take to answer.
const TIMEOUT: Duration = Duration::from_secs(5);

/// The broker's Prometheus endpoint next to each node: same host, port 15692.
pub fn default_endpoints(amqp: &BrokerUrls) -> Vec<String> {
    let mut hosts: Vec<String> = amqp
        .nodes()
        .iter()
        .map(|node| node.parsed().host_str().unwrap_or("127.0.0.1").to_owned())
        .collect();
    hosts.dedup();
    hosts
        .into_iter()
        .map(|host| format!("http://{host}:15692"))
        .collect()
}

/// The vhost the AMQP URLs name (the same in each; `/` when the path is
/// empty).
pub fn vhost(amqp: &BrokerUrls) -> String {
    let path = amqp.nodes()[0]
        .parsed()
        .path()
        .trim_start_matches('/')
        .to_owned();
    if path.is_empty() {
        "/".into()
    } else {
        percent_decode(&path)
    }
}

/// Consumers per queue of `vhost` (standbys included), from every node's
/// endpoint (`http://host:port`; a node reports the queues it leads, so the
/// answers are merged). An error only if no endpoint answered.
pub async fn consumers(endpoints: &[String], vhost: &str) -> Result<HashMap<String, u32>, String> {
    let mut merged: Option<HashMap<String, u32>> = None;
    let mut failures = Vec::new();
    for endpoint in endpoints {
        match node_consumers(endpoint, vhost).await {
            Ok(found) => {
                let all = merged.get_or_insert_with(HashMap::new);
                for (queue, n) in found {
                    let slot = all.entry(queue).or_default();
                    *slot = (*slot).max(n);
                }
            }
            Err(e) => failures.push(e),
        }
    }
    merged.ok_or_else(|| failures.join("; "))
}

async fn node_consumers(endpoint: &str, vhost: &str) -> Result<HashMap<String, u32>, String> {
    let authority = endpoint
        .strip_prefix("http://")
        .ok_or_else(|| format!("{endpoint}: only http:// is supported"))?
        .trim_end_matches('/');
    let path = format!(
        "/metrics/detailed?vhost={}&family=queue_consumer_count",
        percent_encode(vhost)
    );
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(authority).await?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: {authority}\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&response).into_owned())
    };
    let response = tokio::time::timeout(TIMEOUT, fetch)
        .await
        .map_err(|_| format!("{endpoint} did not answer within {TIMEOUT:?}"))?
        .map_err(|e| format!("{endpoint}: {e}"))?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{endpoint}: not an HTTP answer"))?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        let status = head.lines().next().unwrap_or_default();
        return Err(format!("{endpoint}: {status}"));
    }
    Ok(parse(body, vhost))
}

/// `rabbitmq_detailed_queue_consumers{vhost="V",queue="Q"} N` lines of `vhost`.
fn parse(body: &str, vhost: &str) -> HashMap<String, u32> {
    let wanted = format!("vhost=\"{vhost}\"");
    body.lines()
        .filter_map(|line| {
            let labels = line.strip_prefix("rabbitmq_detailed_queue_consumers{")?;
            let (labels, value) = labels.rsplit_once("} ")?;
            if !labels.split(',').any(|l| l == wanted) {
                return None;
            }
            let queue = labels
                .split(',')
                .find_map(|l| l.strip_prefix("queue=\""))?
                .strip_suffix('"')?;
            Some((queue.to_owned(), value.trim().parse::<f64>().ok()? as u32))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_consumers_of_one_vhost() {
        let body = "# TYPE rabbitmq_detailed_queue_consumers gauge\n\
            rabbitmq_detailed_queue_consumers{vhost=\"/\",queue=\"pesanan.shard-000\"} 2\n\
            rabbitmq_detailed_queue_consumers{vhost=\"other\",queue=\"pesanan.shard-000\"} 5\n\
            rabbitmq_detailed_queue_consumers{vhost=\"/\",queue=\"pesanan.dlq\"} 0\n";
        let found = parse(body, "/");
        assert_eq!(found.len(), 2);
        assert_eq!(found["pesanan.shard-000"], 2);
        assert_eq!(found["pesanan.dlq"], 0);
    }

    #[test]
    fn vhosts_come_from_the_url() {
        let url = |s: &str| s.parse::<BrokerUrls>().expect("url");
        assert_eq!(vhost(&url("amqp://u:p@h:5672/%2f")), "/");
        assert_eq!(vhost(&url("amqp://u:p@h:5672")), "/");
        assert_eq!(
            vhost(&url("amqp://u:p@h:5672/urutan-test-a_1")),
            "urutan-test-a_1"
        );
        assert_eq!(percent_encode("/"), "%2F");
        assert_eq!(
            default_endpoints(&url("amqp://u:p@r1:5672/%2f,amqp://u:p@r2:5672/%2f")),
            ["http://r1:15692", "http://r2:15692"]
        );
    }
}
