//! A minimal AMQP 0-9-1 publisher written frame by frame, for what lapin
//! cannot send: properties that break the protocol's rules, such as a
//! `message_id` short string that is not UTF-8 (AMQP only says "octets").

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::wire::{self, longstr, shortstr};

const FRAME_METHOD: u8 = 1;
const FRAME_HEADER: u8 = 2;
const FRAME_BODY: u8 = 3;
const FRAME_END: u8 = 0xCE;

fn method(class: u16, method: u16, args: &[u8]) -> Vec<u8> {
    let mut payload = Vec::with_capacity(4 + args.len());
    payload.extend_from_slice(&class.to_be_bytes());
    payload.extend_from_slice(&method.to_be_bytes());
    payload.extend_from_slice(args);
    payload
}

struct Conn(TcpStream);

impl Conn {
    async fn send(&mut self, kind: u8, channel: u16, payload: &[u8]) {
        let mut frame = vec![kind];
        frame.extend_from_slice(&channel.to_be_bytes());
        frame.extend_from_slice(&u32::try_from(payload.len()).expect("size").to_be_bytes());
        frame.extend_from_slice(payload);
        frame.push(FRAME_END);
        self.0.write_all(&frame).await.expect("write frame");
    }

    /// Reads frames until a method frame of (class, method); returns its arguments.
    async fn expect(&mut self, class: u16, method: u16) -> Vec<u8> {
        loop {
            let mut head = [0u8; 7];
            self.0.read_exact(&mut head).await.expect("frame header");
            let size = u32::from_be_bytes([head[3], head[4], head[5], head[6]]) as usize;
            let mut payload = vec![0u8; size + 1];
            self.0
                .read_exact(&mut payload)
                .await
                .expect("frame payload");
            if head[0] != FRAME_METHOD {
                continue;
            }
            let got = (
                u16::from_be_bytes([payload[0], payload[1]]),
                u16::from_be_bytes([payload[2], payload[3]]),
            );
            assert_eq!(got, (class, method), "unexpected AMQP method");
            return payload[4..size].to_vec();
        }
    }
}

/// Publishes one persistent message with `headers` (string values) and the
/// raw `message_id` bytes to `routing_key` through the default exchange of
/// `vhost`, as guest, and closes cleanly (so the broker has routed it).
pub async fn publish_raw(
    vhost: &str,
    routing_key: &str,
    message_id: &[u8],
    headers: &[(&str, &str)],
    body: &[u8],
) {
    let entries: Vec<(&[u8], Vec<u8>)> = headers
        .iter()
        .map(|(key, value)| (key.as_bytes(), wire::text(value.as_bytes())))
        .collect();
    let properties = wire::properties(&wire::table(&entries), message_id);
    publish_raw_to(vhost, "", routing_key, &properties, body).await;
}

/// Publishes one message with `properties` exactly as encoded (see
/// `urutan_testkit::wire`) to `exchange` with `routing_key` in `vhost`,
/// as guest, and closes cleanly (so the broker has routed it). The content
/// header must fit one frame (128 KiB by default).
pub async fn publish_raw_to(
    vhost: &str,
    exchange: &str,
    routing_key: &str,
    properties: &[u8],
    body: &[u8],
) {
    let run = async {
        let mut c = Conn(
            TcpStream::connect(crate::common::amqp_addr())
                .await
                .expect("connect"),
        );
        c.0.write_all(b"AMQP\x00\x00\x09\x01")
            .await
            .expect("protocol header");
        c.expect(10, 10).await; // connection.start
        let mut start_ok = 0u32.to_be_bytes().to_vec(); // client properties: empty table
        shortstr(&mut start_ok, b"PLAIN");
        longstr(&mut start_ok, b"\0guest\0guest");
        shortstr(&mut start_ok, b"en_US");
        c.send(FRAME_METHOD, 0, &method(10, 11, &start_ok)).await;
        let tune = c.expect(10, 30).await;
        let mut tune_ok = tune[..6].to_vec(); // channel-max, frame-max
        tune_ok.extend_from_slice(&0u16.to_be_bytes()); // no heartbeat
        c.send(FRAME_METHOD, 0, &method(10, 31, &tune_ok)).await;
        let mut open = Vec::new();
        shortstr(&mut open, vhost.as_bytes());
        shortstr(&mut open, b"");
        open.push(0);
        c.send(FRAME_METHOD, 0, &method(10, 40, &open)).await;
        c.expect(10, 41).await;
        c.send(FRAME_METHOD, 1, &method(20, 10, &[0])).await;
        c.expect(20, 11).await;

        let mut publish = 0u16.to_be_bytes().to_vec();
        shortstr(&mut publish, exchange.as_bytes());
        shortstr(&mut publish, routing_key.as_bytes());
        publish.push(0);
        c.send(FRAME_METHOD, 1, &method(60, 40, &publish)).await;

        // Content header: class, weight, body size, then the properties.
        let mut header = 60u16.to_be_bytes().to_vec();
        header.extend_from_slice(&0u16.to_be_bytes());
        header.extend_from_slice(&(body.len() as u64).to_be_bytes());
        header.extend_from_slice(properties);
        c.send(FRAME_HEADER, 1, &header).await;
        c.send(FRAME_BODY, 1, body).await;

        // channel.close / close-ok: everything before it was handled.
        let mut close = 200u16.to_be_bytes().to_vec();
        shortstr(&mut close, b"done");
        close.extend_from_slice(&[0, 0, 0, 0]);
        c.send(FRAME_METHOD, 1, &method(20, 40, &close)).await;
        c.expect(20, 41).await;
        c.send(FRAME_METHOD, 0, &method(10, 50, &close)).await;
        c.expect(10, 51).await;
    };
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("raw publish within 10 s");
}
