package relay

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/twmb/franz-go/pkg/kerr"
)

// classify: see publisher; transient and refused tell kafka-go's errors apart.
func (p *kafkaPublisher) classify(err error) failure {
	if err == nil { // most calls: before errors.As, whose target would escape for each
		return failNone
	}
	// franz-go's errors (the exactly-once producer's) by kafka-go's codes.
	var fe *kerr.Error
	if errors.As(err, &fe) {
		err = fmt.Errorf("%w: %w", kafka.Error(fe.Code), err)
	}
	switch {
	case refused(err):
		return failRefused
	case transient(err):
		return failUnreachable
	}
	return failEvent
}

// transient reports whether err says that the brokers could not be reached or were not ready
// (the event itself is fine), as opposed to a broker refusing this event or its topic.
// refused reports whether err is the cluster refusing the relay itself rather than one event:
// its credentials (SASL), its permissions (ACLs), its TLS settings (an unknown CA, a name the
// certificate does not cover, TLS against a plaintext listener, a client certificate refused), or
// a topic that does not exist (auto-creation off, or a topic map naming the wrong one). Every
// event of the relay, or of that topic, fails alike until someone fixes it: no event is charged
// an attempt, and when nothing gets through the relay backs off as a whole and says why.
func refused(err error) bool {
	if err == nil {
		return false
	}
	var ke kafka.Error
	if errors.As(err, &ke) {
		switch ke {
		case kafka.SASLAuthenticationFailed, kafka.UnsupportedSASLMechanism, kafka.IllegalSASLState,
			kafka.TopicAuthorizationFailed, kafka.ClusterAuthorizationFailed, kafka.TransactionalIDAuthorizationFailed,
			kafka.UnknownTopicOrPartition, kafka.InvalidTopic:
			return true
		}
		return false
	}
	var (
		unknownCA  x509.UnknownAuthorityError
		wrongHost  x509.HostnameError
		badCert    x509.CertificateInvalidError
		unverified *tls.CertificateVerificationError
		notTLS     tls.RecordHeaderError
		alert      tls.AlertError
	)
	// An alert the broker sent (its type is unexported): "remote error: tls: bad certificate".
	return errors.As(err, &unknownCA) || errors.As(err, &wrongHost) || errors.As(err, &badCert) ||
		errors.As(err, &unverified) || errors.As(err, &notTLS) || errors.As(err, &alert) ||
		strings.Contains(err.Error(), "remote error: tls: ")
}

func transient(err error) bool {
	if err == nil {
		return false
	}
	if refused(err) {
		return false
	}
	var ke kafka.Error
	if errors.As(err, &ke) {
		if ke == kafka.InvalidMessage {
			return false // a corrupt message: the event's
		}
		return ke.Temporary()
	}
	if errors.Is(err, protocol.ErrNoLeader) || errors.Is(err, protocol.ErrNoTopic) || errors.Is(err, protocol.ErrNoPartition) {
		// The client's metadata names no leader for the partition (a broker coming back or a
		// leader election), or does not have the topic or partition yet: the cluster's state, not
		// the event's.
		return true
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.ErrClosedPipe) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, net.ErrClosed) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne)
}
