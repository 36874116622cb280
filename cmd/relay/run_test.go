package main

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/relay"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// TestSecretsNotLogged runs `relay run` against a database it cannot reach, with a password in
// the URL and a SASL password: while it retries, its logs name the database host, never the
// passwords.
func TestSecretsNotLogged(t *testing.T) {
	port, err := pgtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	url := "postgres://relay:Sup3rS3cret-pg@127.0.0.1:" + strconv.Itoa(port) + "/shop?sslmode=disable"
	env := map[string]string{
		relay.EnvDatabaseURL: url, "OUTBOX_KAFKA_SASL_MECHANISM": "plain",
		relay.EnvSASLUsername: "relay", relay.EnvSASLPassword: "Sup3rS3cret-kafka",
	}
	var logs syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- command(ctx, []string{"run", "--http-addr", "", "--log-format", "text",
			"--brokers", "127.0.0.1:1", "--default-topic", "t"}, envOf(env), &logs, &logs)
	}()
	waitFor(t, 20*time.Second, "a retry to be logged", func() bool {
		return strings.Contains(logs.String(), "cannot connect to the database")
	})
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("relay run stopped with exit code %d, want 0", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("relay run did not stop within 10s of its context ending")
	}
	log := logs.String()
	for _, secret := range []string{"Sup3rS3cret", url} {
		if strings.Contains(log, secret) {
			t.Errorf("the log holds %q:\n%s", secret, log)
		}
	}
	if !strings.Contains(log, "127.0.0.1:"+strconv.Itoa(port)+"/shop") {
		t.Errorf("the log does not name the database host:\n%s", log)
	}
}
