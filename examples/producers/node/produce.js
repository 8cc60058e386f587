#!/usr/bin/env node
// Publishes events straight to urutan's entry exchange (not through the outbox).
//
//   produce.js --orders N --versions M [--pause-ms MS] [--order-prefix P]
//
// Environment: AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/%2f),
// ENTITY (default pesanan: header x-<ENTITY>-id), TOPOLOGY_PREFIX (default
// ENTITY: exchange and routing keys <prefix>.<status>).
//
// What a direct producer must do (docs/producers.md): publisher confirms and
// `mandatory`; a nack, a returned message (routed to no queue) or a lost
// connection before the confirm means NOT SENT, and that version is
// published again with the SAME message_id before anything newer of the
// order. Header x-<entity>-id as an AMQP string, persistent, one message_id
// per version: running it twice changes nothing.
//
// Versions go out in waves (version 1 of every order, then version 2, ...);
// a wave is published in one go and its confirms awaited; what was not
// confirmed is published again before the next wave.
'use strict';

const amqp = require('amqplib');

const STATUSES = ['dibuat', 'menunggu_bayar', 'dibayar', 'dikirim', 'selesai'];
const GIVE_UP_AFTER_MS = 180_000; // without progress
const WAVE_TIMEOUT_MS = 15_000; // a confirm missing this long counts as not sent

const log = (msg) => process.stderr.write(`produce[node]: ${msg}\n`);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function args(argv) {
  const out = { orders: null, versions: null, pauseMs: 0, orderPrefix: 'JS' };
  for (let i = 2; i < argv.length; i += 2) {
    const [flag, value] = [argv[i], argv[i + 1]];
    if (flag === '--orders') out.orders = Number(value);
    else if (flag === '--versions') out.versions = Number(value);
    else if (flag === '--pause-ms') out.pauseMs = Number(value);
    else if (flag === '--order-prefix') out.orderPrefix = value;
    else throw new Error(`unknown argument ${flag}`);
  }
  if (!(out.orders > 0) || !(out.versions > 0)) {
    throw new Error('usage: produce.js --orders N --versions M [--pause-ms MS] [--order-prefix P]');
  }
  return out;
}

class Producer {
  constructor(url, entity, prefix) {
    this.url = url;
    this.header = `x-${entity}-id`;
    this.prefix = prefix;
    this.conn = null;
    this.channel = null;
    this.returned = new Set(); // message ids the broker returned (mandatory)
    this.reconnects = 0;
    this.resends = 0;
  }

  /** Connects, retrying with backoff while the broker is away. */
  async connect() {
    const deadline = Date.now() + GIVE_UP_AFTER_MS;
    for (let delay = 200; ; delay = Math.min(delay * 2, 5000)) {
      try {
        const conn = await amqp.connect(this.url, { heartbeat: 10 });
        conn.on('error', (e) => log(`connection error: ${e.message}`));
        const channel = await conn.createConfirmChannel();
        channel.on('error', (e) => log(`channel error: ${e.message}`));
        // A mandatory message routed to no queue comes back before its ack.
        channel.on('return', (msg) => this.returned.add(msg.properties.messageId));
        this.conn = conn;
        this.channel = channel;
        return;
      } catch (e) {
        if (Date.now() > deadline) throw e;
        log(`cannot connect (${e.message}); retrying in ${delay} ms`);
        await sleep(delay);
      }
    }
  }

  async close() {
    try {
      if (this.conn) await this.conn.close();
    } catch (_) {
      // already gone
    }
    this.conn = null;
    this.channel = null;
  }

  /** Publishes one message; resolves true if acked (returned or not), false otherwise. */
  publishOne(event) {
    return new Promise((resolve) => {
      const timer = setTimeout(() => resolve(false), WAVE_TIMEOUT_MS);
      const done = (ok) => {
        clearTimeout(timer);
        resolve(ok);
      };
      try {
        this.channel.publish(
          this.prefix,
          `${this.prefix}.${event.status}`,
          Buffer.from(JSON.stringify(event.body)),
          {
            messageId: event.messageId, // the same on every resend of this version
            headers: { [this.header]: event.order }, // a string: an AMQP string
            persistent: true,
            mandatory: true,
            timestamp: Math.floor(Date.now() / 1000),
            contentType: 'application/json',
          },
          (err) => done(!err), // err: nacked, or the channel closed first
        );
      } catch (_) {
        done(false); // the channel is already closed
      }
    });
  }

  /** Publishes a wave until every message is confirmed and routed. */
  async publishWave(events) {
    let pending = events;
    const deadline = Date.now() + GIVE_UP_AFTER_MS;
    while (pending.length > 0) {
      if (!this.channel) {
        await this.connect();
        this.reconnects += 1;
      }
      for (const e of pending) this.returned.delete(e.messageId);
      const acked = await Promise.all(pending.map((e) => this.publishOne(e)));
      const notSent = pending.filter((e, i) => !acked[i] || this.returned.has(e.messageId));
      if (notSent.length === 0) return;
      const lost = acked.some((ok) => !ok);
      log(`${notSent.length} of ${pending.length} not sent (${lost ? 'nacked or connection lost' : 'returned'}); publishing them again`);
      this.resends += notSent.length;
      if (lost) await this.close(); // a fresh connection for the resend
      else await sleep(500);
      if (Date.now() > deadline) throw new Error(`not confirmed within ${GIVE_UP_AFTER_MS} ms`);
      pending = notSent;
    }
  }
}

async function main() {
  const opts = args(process.argv);
  const url = process.env.AMQP_URL || 'amqp://guest:guest@127.0.0.1:5672/%2f';
  const entity = process.env.ENTITY || 'pesanan';
  const prefix = process.env.TOPOLOGY_PREFIX || entity;
  const producer = new Producer(url, entity, prefix);
  await producer.connect();
  const started = Date.now();
  for (let versi = 1; versi <= opts.versions; versi += 1) {
    const status = STATUSES[(versi - 1) % STATUSES.length];
    const wave = [];
    for (let n = 0; n < opts.orders; n += 1) {
      const order = `${opts.orderPrefix}-${n}`;
      wave.push({
        order,
        status,
        messageId: `${order}-v${versi}`,
        body: { id: order, status, versi, data: { producer: 'node' } },
      });
    }
    await producer.publishWave(wave);
    log(`version ${versi}: ${opts.orders} orders confirmed`);
    if (opts.pauseMs > 0 && versi < opts.versions) await sleep(opts.pauseMs);
  }
  await producer.close();
  const secs = ((Date.now() - started) / 1000).toFixed(1);
  console.log(`produce[node]: ${opts.orders * opts.versions} events confirmed in ${secs}s; ${producer.resends} resent, ${producer.reconnects} reconnect(s)`);
}

main().catch((e) => {
  log(`failed: ${e.stack || e}`);
  process.exit(1);
});
