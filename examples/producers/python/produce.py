#!/usr/bin/env python3
"""Publishes events straight to urutan's entry exchange (not through the outbox).

    produce.py --orders N --versions M [--pause-ms MS] [--order-prefix P]

Environment: AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/%2f),
ENTITY (default pesanan: header x-<ENTITY>-id), TOPOLOGY_PREFIX (default
ENTITY: exchange and routing keys <prefix>.<status>).

What a direct producer must do (docs/producers.md):
- publisher confirms and `mandatory`: a nack, a returned message (routed to
  no queue) or a lost connection before the confirm means NOT SENT;
- then publish that version again with the SAME message_id before anything
  newer of the order (urutan records a resend as a duplicate);
- header x-<entity>-id as an AMQP string, persistent, one message_id per
  version. Running it twice sends the same message ids: nothing changes.

Versions go out in waves (version 1 of every order, then version 2, ...),
each message confirmed before the next (pika's BlockingChannel with
confirm_delivery waits for every confirm).
"""

import argparse
import json
import os
import sys
import time

import pika
from pika.exceptions import AMQPError, NackError, UnroutableError

STATUSES = ["dibuat", "menunggu_bayar", "dibayar", "dikirim", "selesai"]
GIVE_UP_AFTER = 180  # seconds without a confirmed publish


def log(msg):
    print(f"produce[python]: {msg}", file=sys.stderr, flush=True)


class Producer:
    def __init__(self, url, entity, prefix):
        self.params = pika.URLParameters(url)
        self.params.heartbeat = 10
        self.params.blocked_connection_timeout = 30
        self.header = f"x-{entity}-id"
        self.prefix = prefix
        self.connection = None
        self.channel = None
        self.reconnects = 0
        self.resends = 0

    def connect(self):
        """Connects, retrying with backoff while the broker is away."""
        delay, deadline = 0.2, time.monotonic() + GIVE_UP_AFTER
        while True:
            try:
                self.connection = pika.BlockingConnection(self.params)
                self.channel = self.connection.channel()
                self.channel.confirm_delivery()
                return
            except AMQPError as e:
                if time.monotonic() > deadline:
                    raise
                log(f"cannot connect ({e!r}); retrying in {delay:.1f}s")
                time.sleep(delay)
                delay = min(delay * 2, 5)

    def close(self):
        try:
            if self.connection and self.connection.is_open:
                self.connection.close()
        except AMQPError:
            pass

    def publish(self, order, versi, status):
        """Publishes one version until the broker confirmed it as routed."""
        message_id = f"{order}-v{versi}"  # the same on every resend of this version
        body = json.dumps(
            {"id": order, "status": status, "versi": versi, "data": {"producer": "python"}}
        ).encode("utf-8")
        props = pika.BasicProperties(
            message_id=message_id,
            headers={self.header: order},  # a str: an AMQP string, as the hash needs
            delivery_mode=2,
            timestamp=int(time.time()),
            content_type="application/json",
        )
        deadline = time.monotonic() + GIVE_UP_AFTER
        while True:
            try:
                self.channel.basic_publish(
                    exchange=self.prefix,
                    routing_key=f"{self.prefix}.{status}",
                    body=body,
                    properties=props,
                    mandatory=True,
                )
                return  # acked and routed
            except (UnroutableError, NackError) as e:
                why = "returned (routed to no queue)" if isinstance(e, UnroutableError) else "nacked"
                log(f"{message_id} {why}: not sent, publishing it again")
                time.sleep(0.5)
            except AMQPError as e:
                # The connection or channel went before the confirm: not sent.
                log(f"{message_id}: connection lost before the confirm ({e!r}); reconnecting")
                self.close()
                self.connect()
                self.reconnects += 1
            self.resends += 1
            if time.monotonic() > deadline:
                raise SystemExit(f"produce[python]: {message_id} not confirmed in {GIVE_UP_AFTER}s")


def main():
    parser = argparse.ArgumentParser(description="Publish order events straight to urutan's exchange.")
    parser.add_argument("--orders", type=int, required=True)
    parser.add_argument("--versions", type=int, required=True)
    parser.add_argument("--pause-ms", type=int, default=0, help="pause between two versions (waves)")
    parser.add_argument("--order-prefix", default="PY", help="order ids are <prefix>-<n>")
    args = parser.parse_args()

    url = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")
    entity = os.environ.get("ENTITY", "pesanan")
    prefix = os.environ.get("TOPOLOGY_PREFIX", entity)
    producer = Producer(url, entity, prefix)
    producer.connect()
    started = time.monotonic()
    for versi in range(1, args.versions + 1):
        status = STATUSES[(versi - 1) % len(STATUSES)]
        for n in range(args.orders):
            producer.publish(f"{args.order_prefix}-{n}", versi, status)
        log(f"version {versi}: {args.orders} orders confirmed")
        if args.pause_ms and versi < args.versions:
            time.sleep(args.pause_ms / 1000)
    producer.close()
    total = args.orders * args.versions
    print(
        f"produce[python]: {total} events confirmed in {time.monotonic() - started:.1f}s; "
        f"{producer.resends} resent, {producer.reconnects} reconnect(s)",
        flush=True,
    )


if __name__ == "__main__":
    main()
