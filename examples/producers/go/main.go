// Command produce publishes events straight to urutan's entry exchange (not
// through the outbox).
//
//	produce --orders N --versions M [--pause-ms MS] [--order-prefix P]
//
// Environment: AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/%2f),
// ENTITY (default pesanan: header x-<ENTITY>-id), TOPOLOGY_PREFIX (default
// ENTITY: exchange and routing keys <prefix>.<status>).
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
// confirmed is published again before the next wave.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

var statuses = []string{"dibuat", "menunggu_bayar", "dibayar", "dikirim", "selesai"}

const (
	giveUpAfter = 180 * time.Second // without progress
	waveTimeout = 15 * time.Second  // a confirm missing this long counts as not sent
	dialTimeout = 15 * time.Second  // a connection attempt unanswered this long failed
)

type event struct {
	header, order, status, messageID string
	body                             []byte
}

type producer struct {
	url, header, prefix string
	conn                *amqp.Connection
	ch                  *amqp.Channel
	returns             chan amqp.Return
	reconnects, resends int
}

func env(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

// connect dials, retrying with backoff while the broker is away. One
// attempt that gets no answer within dialTimeout counts as failed: a broker
// that is starting can accept the TCP connection and then say nothing.
func (p *producer) connect() error {
	deadline := time.Now().Add(giveUpAfter)
	for delay := 200 * time.Millisecond; ; delay = min(delay*2, 5*time.Second) {
		l, err := dialWithin(p.url, dialTimeout)
		if err == nil {
			p.conn, p.ch, p.returns = l.conn, l.ch, l.returns
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		log.Printf("cannot connect (%v); retrying in %v", err, delay)
		time.Sleep(delay)
	}
}

type link struct {
	conn    *amqp.Connection
	ch      *amqp.Channel
	returns chan amqp.Return
}

// dial opens a connection and a channel in confirm mode.
func dial(url string) (*link, error) {
	conn, err := amqp.DialConfig(url, amqp.Config{Heartbeat: 10 * time.Second})
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		abandon(conn)
		return nil, err
	}
	// Returns arrive before the ack of the same message.
	return &link{conn, ch, ch.NotifyReturn(make(chan amqp.Return, 100000))}, nil
}

// dialWithin is dial bounded in time; a late connection is closed.
func dialWithin(url string, d time.Duration) (*link, error) {
	type result struct {
		l   *link
		err error
	}
	res := make(chan result, 1)
	go func() {
		l, err := dial(url)
		res <- result{l, err}
	}()
	select {
	case r := <-res:
		return r.l, r.err
	case <-time.After(d):
		go func() {
			if r := <-res; r.l != nil {
				abandon(r.l.conn)
			}
		}()
		return nil, fmt.Errorf("no answer within %v", d)
	}
}

// abandon closes a connection without waiting for it: the client library's
// Close waits for the broker's close-ok, which a broker going down may never
// send.
func abandon(conn *amqp.Connection) {
	go conn.Close()
}

func min(a, b time.Duration) time.Duration {
	if a < b {
		return a
	}
	return b
}

// waitConfirm waits for one confirm, at most until deadline. A closed
// channel nacks every pending confirm, so Wait returns on a lost connection.
func waitConfirm(dc *amqp.DeferredConfirmation, deadline time.Time) bool {
	done := make(chan bool, 1)
	go func() { done <- dc.Wait() }()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case ok := <-done:
		return ok
	case <-timer.C:
		return false
	}
}

// close drops the connection without waiting for the broker (see abandon).
func (p *producer) close() {
	if p.conn != nil {
		abandon(p.conn)
	}
	p.conn, p.ch = nil, nil
}

// publishAll publishes the events on ch; a nil confirmation means not sent
// (the channel failed on the way). It gives up on the channel if the
// publishing itself blocks past waveTimeout (a write to a dying connection
// can): then nothing of this round counts as sent.
func publishAll(ch *amqp.Channel, exchange string, events []event) ([]*amqp.DeferredConfirmation, bool) {
	done := make(chan []*amqp.DeferredConfirmation, 1)
	go func() {
		confirms := make([]*amqp.DeferredConfirmation, len(events))
		for i, e := range events {
			msg := amqp.Publishing{
				MessageId:    e.messageID,                   // the same on every resend of this version
				Headers:      amqp.Table{e.header: e.order}, // a Go string: an AMQP string
				DeliveryMode: amqp.Persistent,
				Timestamp:    time.Now(),
				ContentType:  "application/json",
				Body:         e.body,
			}
			dc, err := ch.PublishWithDeferredConfirm(exchange, exchange+"."+e.status, true, false, msg)
			if err != nil {
				break // the channel is gone: the rest is not sent
			}
			confirms[i] = dc
		}
		done <- confirms
	}()
	select {
	case confirms := <-done:
		return confirms, true
	case <-time.After(waveTimeout):
		return make([]*amqp.DeferredConfirmation, len(events)), false
	}
}

// publishWave publishes events until every one is confirmed and routed.
func (p *producer) publishWave(events []event) error {
	pending := events
	deadline := time.Now().Add(giveUpAfter)
	for len(pending) > 0 {
		if p.ch == nil || p.ch.IsClosed() {
			p.close()
			if err := p.connect(); err != nil {
				return err
			}
			p.reconnects++
		}
		confirms, published := publishAll(p.ch, p.prefix, pending)
		if !published {
			log.Printf("publishing blocked for %v; dropping the connection", waveTimeout)
		}
		acked := make([]bool, len(pending))
		waveDeadline := time.Now().Add(waveTimeout)
		lost := false
		for i, dc := range confirms {
			if dc == nil {
				lost = true
				continue
			}
			acked[i] = waitConfirm(dc, waveDeadline) // false: nacked, the channel closed first, or too late
			lost = lost || !acked[i]
		}
		returned := map[string]bool{}
	drain:
		for {
			select {
			case r, open := <-p.returns:
				if !open {
					// The channel closed (a lost connection) and the
					// library closed this one: a closed channel is always
					// ready, so reading on would spin here forever.
					break drain
				}
				returned[r.MessageId] = true
			default:
				break drain
			}
		}
		var notSent []event
		for i, e := range pending {
			if !acked[i] || returned[e.messageID] {
				notSent = append(notSent, e)
			}
		}
		if len(notSent) == 0 {
			return nil
		}
		why := "returned"
		if lost {
			why = "nacked or connection lost"
			p.close() // a fresh connection for the resend
		} else {
			time.Sleep(500 * time.Millisecond)
		}
		log.Printf("%d of %d not sent (%s); publishing them again", len(notSent), len(pending), why)
		p.resends += len(notSent)
		if time.Now().After(deadline) {
			return fmt.Errorf("not confirmed within %v", giveUpAfter)
		}
		pending = notSent
	}
	return nil
}

func main() {
	log.SetFlags(0)
	log.SetPrefix("produce[go]: ")
	orders := flag.Int("orders", 0, "orders (entities)")
	versions := flag.Int("versions", 0, "versions per order")
	pauseMs := flag.Int("pause-ms", 0, "pause between two versions (waves)")
	orderPrefix := flag.String("order-prefix", "GO", "order ids are <prefix>-<n>")
	flag.Parse()
	if *orders < 1 || *versions < 1 {
		log.Fatal("usage: produce --orders N --versions M [--pause-ms MS] [--order-prefix P]")
	}
	entity := env("ENTITY", "pesanan")
	p := &producer{
		url:    env("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f"),
		header: "x-" + entity + "-id",
		prefix: env("TOPOLOGY_PREFIX", entity),
	}
	if err := p.connect(); err != nil {
		log.Fatal(err)
	}
	started := time.Now()
	// The last resort: a producer that makes no progress for giveUpAfter
	// says so and exits, whatever it is blocked on.
	watchdog := time.AfterFunc(giveUpAfter, func() {
		log.Fatalf("no version confirmed within %v; giving up", giveUpAfter)
	})
	for versi := 1; versi <= *versions; versi++ {
		status := statuses[(versi-1)%len(statuses)]
		wave := make([]event, 0, *orders)
		for n := 0; n < *orders; n++ {
			order := fmt.Sprintf("%s-%d", *orderPrefix, n)
			body, _ := json.Marshal(map[string]any{
				"id": order, "status": status, "versi": versi,
				"data": map[string]string{"producer": "go"},
			})
			wave = append(wave, event{p.header, order, status, fmt.Sprintf("%s-v%d", order, versi), body})
		}
		if err := p.publishWave(wave); err != nil {
			log.Fatal(err)
		}
		watchdog.Reset(giveUpAfter)
		log.Printf("version %d: %d orders confirmed", versi, *orders)
		if *pauseMs > 0 && versi < *versions {
			time.Sleep(time.Duration(*pauseMs) * time.Millisecond)
		}
	}
	watchdog.Stop()
	// Everything is confirmed: a clean close, waited for a few seconds at most.
	closed := make(chan struct{})
	go func() {
		if p.conn != nil {
			p.conn.Close()
		}
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
	}
	fmt.Printf("produce[go]: %d events confirmed in %.1fs; %d resent, %d reconnect(s)\n",
		*orders**versions, time.Since(started).Seconds(), p.resends, p.reconnects)
}
