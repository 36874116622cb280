// A fetched outbox row, and how a batch scans rows into its arena.

package relay

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// row is one fetched outbox row. Its byte fields alias the batch's arena.
type row struct {
	id        int64
	createdAt time.Time
	attempts  int32
	eventID   []byte // canonical text form
	aggType   []byte
	aggID     []byte
	eventType []byte
	// payload is the record's value: the row's payload_bytes where set, else its JSON payload.
	payload []byte
	// noValue: the row has neither (both NULL), a tombstone where --null-payload tombstone.
	noValue bool
	// isBytes: payload is the row's payload_bytes (not JSON).
	isBytes bool
	headers []byte
	bucket  int16 // a sharded row-tracking fetch's last column

	state   rowState
	topic   string // where the event goes (the dead-letter topic for a dead-lettered row)
	key     []byte // the record's key: aliases aggID, or a header's value (route)
	poison  string // poison reason, "" when none
	errText string // the error to record
	inc     int32  // what the failure adds to attempts
	err     error  // the publish result
}

type rowState uint8

const (
	rowFetched  rowState = iota // not published in this round; stays pending
	rowInFlight                 // handed to the publisher
	rowSent                     // acknowledged by the broker
	rowFailed                   // publish failed (or poison under block): record attempts and error
	rowDeadSent                 // acknowledged on the dead-letter topic
	rowSkipped                  // dropped before publishing: a previous event of its aggregate failed
)

var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// scanRow appends the raw values of one fetched row to b: the columns of fetchColumns, and for a
// sharded row-tracking fetch the bucket after them.
func (b *batch) scanRow(vals [][]byte, fds []pgconn.FieldDescription) error {
	if len(vals) != 10 && len(vals) != 11 {
		return fmt.Errorf("fetch returned %d columns, want 10 or 11", len(vals))
	}
	for i, want := range [10]int16{1, 1, 0, 0, 0, -1, -1, 1, 1, -1} {
		if want >= 0 && fds[i].Format != want {
			return fmt.Errorf("fetch column %s came in format %d, want %d", fds[i].Name, fds[i].Format, want)
		}
	}
	var r row
	if len(vals[0]) != 8 || len(vals[1]) != 16 || len(vals[7]) != 8 || len(vals[8]) != 4 {
		return errors.New("fetch returned a malformed row")
	}
	r.id = int64(binary.BigEndian.Uint64(vals[0]))
	r.createdAt = pgEpoch.Add(time.Duration(int64(binary.BigEndian.Uint64(vals[7]))) * time.Microsecond)
	r.attempts = int32(binary.BigEndian.Uint32(vals[8]))
	r.eventID = b.appendUUID(vals[1])
	r.aggType = b.appendBytes(vals[2])
	r.aggID = b.appendBytes(vals[3])
	r.eventType = b.appendBytes(vals[4])
	switch {
	case vals[9] != nil:
		v, err := byteaValue(vals[9], fds[9].Format)
		if err != nil {
			return err
		}
		r.payload, r.isBytes = b.appendBytes(v), true
	case vals[5] != nil:
		r.payload = b.appendBytes(jsonbText(vals[5], fds[5].Format))
	default:
		r.noValue = true
	}
	r.headers = b.appendBytes(jsonbText(vals[6], fds[6].Format))
	if len(vals) == 11 {
		if fds[10].Format != 1 || len(vals[10]) != 2 {
			return errors.New("fetch returned a malformed bucket")
		}
		r.bucket = int16(binary.BigEndian.Uint16(vals[10]))
	}
	b.rows = append(b.rows, r)
	return nil
}

// byteaValue returns the bytes of a bytea value: as they are in the binary format, decoded from
// the hex text format (\x...) otherwise.
func byteaValue(v []byte, format int16) ([]byte, error) {
	if format == 1 {
		return v, nil
	}
	if len(v) < 2 || v[0] != '\\' || v[1] != 'x' {
		return nil, errors.New("fetch returned a bytea value in an unknown text form")
	}
	out := make([]byte, hex.DecodedLen(len(v)-2))
	if _, err := hex.Decode(out, v[2:]); err != nil {
		return nil, fmt.Errorf("fetch returned a malformed bytea value: %w", err)
	}
	return out, nil
}

// jsonbText strips the version byte of jsonb's binary format.
func jsonbText(v []byte, format int16) []byte {
	if format == 1 && len(v) > 0 && v[0] == 1 {
		return v[1:]
	}
	return v
}

func (b *batch) appendBytes(v []byte) []byte {
	start := len(b.arena)
	b.arena = append(b.arena, v...)
	return b.arena[start:len(b.arena):len(b.arena)]
}

func (b *batch) appendUUID(u []byte) []byte {
	start := len(b.arena)
	var buf [36]byte
	hex.Encode(buf[0:8], u[0:4])
	buf[8] = '-'
	hex.Encode(buf[9:13], u[4:6])
	buf[13] = '-'
	hex.Encode(buf[14:18], u[6:8])
	buf[18] = '-'
	hex.Encode(buf[19:23], u[8:10])
	buf[23] = '-'
	hex.Encode(buf[24:36], u[10:16])
	b.arena = append(b.arena, buf[:]...)
	return b.arena[start:len(b.arena):len(b.arena)]
}
