// Publishes events straight to urutan's entry exchange (not through the outbox).
//
//   java -cp CLASSPATH Produce --orders N --versions M [--pause-ms MS] [--order-prefix P]
//
// Environment: AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/%2f),
// ENTITY (default pesanan: header x-<ENTITY>-id), TOPOLOGY_PREFIX (default
// ENTITY: exchange and routing keys <prefix>.<status>).
//
// Build and run with Debian's packages (no Maven): the RabbitMQ Java client
// from librabbitmq-client-java, which pulls in libslf4j-java, and a JDK 17
// (default-jdk-headless):
//
//   javac -d build -cp /usr/share/java/amqp-client.jar Produce.java
//   java -cp build:/usr/share/java/amqp-client.jar:/usr/share/java/slf4j-api.jar:/usr/share/java/slf4j-simple.jar \
//       Produce --orders 100 --versions 5
//
// What a direct producer must do (docs/producers.md): publisher confirms and
// mandatory; a nack, a returned message (routed to no queue) or a lost
// connection before the confirm means NOT SENT, and that version is
// published again with the SAME message_id before anything newer of the
// order. Header x-<entity>-id as an AMQP string, persistent, one message_id
// per version: running it twice changes nothing.
//
// Versions go out in waves (version 1 of every order, then version 2, ...);
// a wave is published in one go and its confirms awaited; what was not
// confirmed is published again before the next wave. The client's own
// automatic recovery is off: this loop reconnects and resends itself.

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.ConfirmListener;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ConnectionFactory;
import com.rabbitmq.client.ReturnListener;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Date;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.NavigableMap;
import java.util.Set;
import java.util.TreeMap;

public final class Produce {
    static final String[] STATUSES = {"dibuat", "menunggu_bayar", "dibayar", "dikirim", "selesai"};
    static final long GIVE_UP_AFTER_MS = 180_000; // without progress
    static final long WAVE_TIMEOUT_MS = 15_000; // a confirm missing this long counts as not sent

    record Event(String order, String status, String messageId, byte[] body) {}

    static void log(String msg) {
        System.err.println("produce[java]: " + msg);
    }

    static String env(String name, String fallback) {
        String v = System.getenv(name);
        return v == null || v.isEmpty() ? fallback : v;
    }

    /** A JSON string literal (the ids and statuses here are plain, but quote them properly). */
    static String json(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') b.append('\\').append(c);
            else if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
            else b.append(c);
        }
        return b.append('"').toString();
    }

    /**
     * One channel's confirms and returns. The broker confirms by publish
     * sequence number; a return of a mandatory message arrives before its ack.
     * A closed channel confirms nothing more: whatever is still unconfirmed
     * then was not sent.
     */
    static final class Confirms implements ConfirmListener, ReturnListener {
        final NavigableMap<Long, String> unconfirmed = new TreeMap<>(); // sequence number -> message id
        final Set<String> acked = new HashSet<>();
        final Set<String> returned = new HashSet<>();

        synchronized void published(long seq, String messageId) {
            unconfirmed.put(seq, messageId);
        }

        private synchronized void confirm(long seq, boolean multiple, boolean ack) {
            Map<Long, String> done = multiple ? unconfirmed.headMap(seq, true) : unconfirmed.subMap(seq, true, seq, true);
            if (ack) acked.addAll(done.values());
            done.clear(); // a nack: removed, never acked, so not sent
            notifyAll();
        }

        @Override
        public void handleAck(long seq, boolean multiple) {
            confirm(seq, multiple, true);
        }

        @Override
        public void handleNack(long seq, boolean multiple) {
            confirm(seq, multiple, false);
        }

        @Override
        public synchronized void handleReturn(int replyCode, String replyText, String exchange, String routingKey,
                AMQP.BasicProperties props, byte[] body) {
            returned.add(props.getMessageId());
        }

        synchronized void wake() {
            notifyAll();
        }

        /** Waits until nothing is unconfirmed, the channel closed, or the deadline passed. */
        synchronized void await(Channel ch, long deadline) throws InterruptedException {
            long left;
            while (!unconfirmed.isEmpty() && ch.isOpen() && (left = deadline - System.currentTimeMillis()) > 0) {
                wait(left);
            }
        }

        synchronized boolean acked(String messageId) {
            return acked.contains(messageId);
        }

        synchronized boolean returned(String messageId) {
            return returned.contains(messageId);
        }
    }

    final ConnectionFactory factory = new ConnectionFactory();
    final String header;
    final String prefix;
    Connection conn;
    Channel ch;
    int reconnects;
    int resends;

    Produce(String url, String entity, String prefix) throws Exception {
        factory.setUri(url);
        factory.setRequestedHeartbeat(10);
        factory.setConnectionTimeout(10_000);
        factory.setAutomaticRecoveryEnabled(false);
        factory.setTopologyRecoveryEnabled(false);
        this.header = "x-" + entity + "-id";
        this.prefix = prefix;
    }

    /** Connects, retrying with backoff while the broker is away. */
    void connect() throws Exception {
        long deadline = System.currentTimeMillis() + GIVE_UP_AFTER_MS;
        for (long delay = 200; ; delay = Math.min(delay * 2, 5_000)) {
            try {
                conn = factory.newConnection("urutan-producer-java");
                ch = conn.createChannel();
                ch.confirmSelect();
                return;
            } catch (Exception e) {
                close();
                if (System.currentTimeMillis() > deadline) throw e;
                log("cannot connect (" + e + "); retrying in " + delay + " ms");
                Thread.sleep(delay);
            }
        }
    }

    void close() {
        try {
            if (conn != null && conn.isOpen()) conn.close(5_000);
        } catch (Exception e) {
            // already gone
        }
        conn = null;
        ch = null;
    }

    /** Publishes a wave until every event is confirmed and routed. */
    void publishWave(List<Event> events) throws Exception {
        List<Event> pending = events;
        long deadline = System.currentTimeMillis() + GIVE_UP_AFTER_MS;
        while (!pending.isEmpty()) {
            if (ch == null || !ch.isOpen()) {
                close();
                connect();
                reconnects++;
            }
            Confirms confirms = new Confirms(); // this attempt's, on this channel only
            ch.addConfirmListener(confirms);
            ch.addReturnListener(confirms);
            ch.addShutdownListener(cause -> confirms.wake());
            try {
                for (Event e : pending) {
                    AMQP.BasicProperties props = new AMQP.BasicProperties.Builder()
                            .messageId(e.messageId()) // the same on every resend of this version
                            .headers(Map.of(header, e.order())) // a java.lang.String: an AMQP string
                            .deliveryMode(2)
                            .timestamp(new Date())
                            .contentType("application/json")
                            .build();
                    confirms.published(ch.getNextPublishSeqNo(), e.messageId());
                    ch.basicPublish(prefix, prefix + "." + e.status(), true, props, e.body());
                }
            } catch (Exception ex) {
                // the channel is gone: the rest is not sent
            }
            confirms.await(ch, System.currentTimeMillis() + WAVE_TIMEOUT_MS);
            List<Event> notSent = new ArrayList<>();
            boolean lost = false;
            for (Event e : pending) {
                boolean acked = confirms.acked(e.messageId()); // false: nacked, the channel closed first, or too late
                if (!acked || confirms.returned(e.messageId())) notSent.add(e);
                lost = lost || !acked;
            }
            ch.removeConfirmListener(confirms);
            ch.removeReturnListener(confirms);
            if (notSent.isEmpty()) return;
            log(notSent.size() + " of " + pending.size() + " not sent ("
                    + (lost ? "nacked or connection lost" : "returned") + "); publishing them again");
            resends += notSent.size();
            if (lost) close(); // a fresh connection for the resend
            else Thread.sleep(500);
            if (System.currentTimeMillis() > deadline) {
                throw new IllegalStateException("not confirmed within " + GIVE_UP_AFTER_MS / 1000 + " s");
            }
            pending = notSent;
        }
    }

    static void usage() {
        log("usage: Produce --orders N --versions M [--pause-ms MS] [--order-prefix P]");
        System.exit(2);
    }

    public static void main(String[] args) throws Exception {
        int orders = 0, versions = 0, pauseMs = 0;
        String orderPrefix = "JAVA";
        try {
            for (int i = 0; i < args.length; i += 2) {
                String value = args[i + 1];
                switch (args[i]) {
                    case "--orders" -> orders = Integer.parseInt(value);
                    case "--versions" -> versions = Integer.parseInt(value);
                    case "--pause-ms" -> pauseMs = Integer.parseInt(value);
                    case "--order-prefix" -> orderPrefix = value;
                    default -> usage();
                }
            }
        } catch (RuntimeException e) {
            usage();
        }
        if (orders < 1 || versions < 1) usage();
        String entity = env("ENTITY", "pesanan");
        Produce p = new Produce(env("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f"), entity,
                env("TOPOLOGY_PREFIX", entity));
        try {
            p.connect();
            long started = System.currentTimeMillis();
            for (int versi = 1; versi <= versions; versi++) {
                String status = STATUSES[(versi - 1) % STATUSES.length];
                List<Event> wave = new ArrayList<>(orders);
                for (int n = 0; n < orders; n++) {
                    String order = orderPrefix + "-" + n;
                    String body = "{\"id\":" + json(order) + ",\"status\":" + json(status) + ",\"versi\":" + versi
                            + ",\"data\":{\"producer\":\"java\"}}";
                    wave.add(new Event(order, status, order + "-v" + versi, body.getBytes(StandardCharsets.UTF_8)));
                }
                p.publishWave(wave);
                log("version " + versi + ": " + orders + " orders confirmed");
                if (pauseMs > 0 && versi < versions) Thread.sleep(pauseMs);
            }
            p.close();
            System.out.printf("produce[java]: %d events confirmed in %.1fs; %d resent, %d reconnect(s)%n",
                    orders * versions, (System.currentTimeMillis() - started) / 1000.0, p.resends, p.reconnects);
        } catch (Exception e) {
            log("failed: " + e);
            System.exit(1);
        }
    }
}
