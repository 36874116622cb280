// Package kafkaauth builds the TLS configuration and the SASL mechanism of a Kafka client from
// PEM bytes and credentials: one definition for the relays (which read them from files and
// variables) and the operator (which reads them from the same Secrets to check topics).
package kafkaauth

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"

	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
	franzsasl "github.com/twmb/franz-go/pkg/sasl"
	franzplain "github.com/twmb/franz-go/pkg/sasl/plain"
	franzscram "github.com/twmb/franz-go/pkg/sasl/scram"
)

// SASL mechanism names, as the relay's --kafka-sasl-mechanism spells them (case-insensitive here:
// the API spells them PLAIN, SCRAM-SHA-256, SCRAM-SHA-512).
const (
	Plain       = "plain"
	ScramSHA256 = "scram-sha-256"
	ScramSHA512 = "scram-sha-512"
)

// TLS returns a TLS configuration (TLS 1.2 at least) that trusts ca where given (else the
// system's roots) and presents cert and key where given. Errors never quote the bytes.
func TLS(ca, cert, key []byte, insecureSkipVerify bool) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: insecureSkipVerify} //nolint:gosec // opt-in, documented
	if len(ca) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(ca) {
			return nil, errors.New("the CA holds no PEM certificate")
		}
		cfg.RootCAs = pool
	}
	if len(cert) > 0 || len(key) > 0 {
		pair, err := tls.X509KeyPair(cert, key)
		if err != nil {
			return nil, errors.New("the client certificate and key do not form a key pair")
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// SASL returns the mechanism named (Plain, ScramSHA256 or ScramSHA512, any case) with the
// credentials. Errors never quote them.
func SASL(mechanism, username, password string) (sasl.Mechanism, error) {
	switch strings.ToLower(mechanism) {
	case Plain:
		return plain.Mechanism{Username: username, Password: password}, nil
	case ScramSHA256, ScramSHA512:
		algo := scram.SHA256
		if strings.EqualFold(mechanism, ScramSHA512) {
			algo = scram.SHA512
		}
		m, err := scram.Mechanism(algo, username, password)
		if err != nil {
			return nil, fmt.Errorf("SASL %s: the credentials cannot be used", mechanism)
		}
		return m, nil
	}
	return nil, fmt.Errorf("SASL mechanism %q: want %s, %s or %s", mechanism, Plain, ScramSHA256, ScramSHA512)
}

// FranzSASL is SASL for franz-go's client (the exactly-once producer): the same mechanisms and
// credentials. Errors never quote the credentials.
func FranzSASL(mechanism, username, password string) (franzsasl.Mechanism, error) {
	switch strings.ToLower(mechanism) {
	case Plain:
		return franzplain.Auth{User: username, Pass: password}.AsMechanism(), nil
	case ScramSHA256:
		return franzscram.Auth{User: username, Pass: password}.AsSha256Mechanism(), nil
	case ScramSHA512:
		return franzscram.Auth{User: username, Pass: password}.AsSha512Mechanism(), nil
	}
	return nil, fmt.Errorf("SASL mechanism %q: want %s, %s or %s", mechanism, Plain, ScramSHA256, ScramSHA512)
}
