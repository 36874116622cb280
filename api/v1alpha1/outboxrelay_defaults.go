/*
Copyright 2026 The outbox-operator Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package v1alpha1

import "github.com/outbox-operator/outbox-operator/internal/contract"

// The spec's values as the relay and the operator use them: the Secret keys with their defaults
// filled in (for an object the API server has not defaulted, as in the operator's unit tests or
// the plugin reading an old object), and the tracking mode in the contract's spelling.

// URLKey returns the Secret key that holds the database URL: key, or DefaultDatabaseURLKey.
func (r DatabaseSecretRef) URLKey() string {
	if r.Key == "" {
		return DefaultDatabaseURLKey
	}
	return string(r.Key)
}

// Keys returns the Secret keys of the SASL username and password, the defaults for those unset
// (DefaultSASLUsernameKey, DefaultSASLPasswordKey).
func (r SASLSecretRef) Keys() (username, password string) {
	username, password = string(r.UsernameKey), string(r.PasswordKey)
	if username == "" {
		username = DefaultSASLUsernameKey
	}
	if password == "" {
		password = DefaultSASLPasswordKey
	}
	return username, password
}

// ResolvedTracking returns the tracking mode the relays of r run: Snapshot where
// spec.publish.tracking or status.tracking says Snapshot (a table tracked by snapshot never goes
// back), else Row where either says Row, else "" (not resolved yet: the operator resolves an
// unset spec.publish.tracking from the table and records it in status.tracking).
func (r *OutboxRelay) ResolvedTracking() Tracking {
	spec, recorded := r.Spec.Publish.Tracking, r.Status.Tracking
	switch {
	case spec == TrackSnapshot || recorded == TrackSnapshot:
		return TrackSnapshot
	case spec == TrackRow || recorded == TrackRow:
		return TrackRow
	}
	return ""
}

// TrackingOf returns the API's spelling of a tracking mode of the contract's.
func TrackingOf(m contract.Tracking) Tracking {
	if m == contract.TrackSnapshot {
		return TrackSnapshot
	}
	return TrackRow
}

// Mode returns the record timestamp in the contract's spelling (contract.RecordTimestamp):
// ProduceTime is contract.TimestampProduce, CreatedAt or unset contract.TimestampCreated.
func (t RecordTimestamp) Mode() contract.RecordTimestamp {
	if t == TimestampProduceTime {
		return contract.TimestampProduce
	}
	return contract.TimestampCreated
}

// Mode returns the tracking mode in the contract's spelling (contract.Tracking): Snapshot is
// contract.TrackSnapshot, Row or unset contract.TrackRow.
func (t Tracking) Mode() contract.Tracking {
	if t == TrackSnapshot {
		return contract.TrackSnapshot
	}
	return contract.TrackRow
}
