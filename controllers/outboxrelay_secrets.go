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

// The Secrets an OutboxRelay names: reading their values (never cached) and the hash of them that
// rolls the relays when one changes.

package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
)

// secretHash hashes the referenced Secret values. Entries are name/key/value triples; the order
// of entries does not matter.
func secretHash(entries map[string][]byte) string {
	keys := make([]string, 0, len(entries))
	for k := range entries {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	h := sha256.New()
	var n [8]byte
	for _, k := range keys {
		for _, part := range [][]byte{[]byte(k), entries[k]} {
			binary.BigEndian.PutUint64(n[:], uint64(len(part)))
			h.Write(n[:])
			h.Write(part)
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// relayDatabaseRef is the Secret key the relay pods take their database URL from:
// spec.relay.databaseSecretRef, or unset, the operator's own spec.database.secretRef.
func relayDatabaseRef(relay *v1alpha1.OutboxRelay) v1alpha1.DatabaseSecretRef {
	if ref := relay.Spec.Relay.DatabaseSecretRef; ref != nil {
		return *ref
	}
	return relay.Spec.Database.SecretRef
}

// secretRefsOf lists every Secret name the spec refers to (the database Secrets of the operator
// and of the relays, the TLS and SASL Secrets).
func secretRefsOf(relay *v1alpha1.OutboxRelay) []string {
	names := []string{string(relay.Spec.Database.SecretRef.Name), string(relayDatabaseRef(relay).Name)}
	for _, f := range tlsFiles(relay.Spec.Kafka.TLS) {
		names = append(names, string(f.ref.Name))
	}
	if sasl := relay.Spec.Kafka.SASL; sasl != nil {
		names = append(names, string(sasl.SecretRef.Name))
	}
	if sr := relay.Spec.Publish.SchemaRegistry; sr != nil && sr.CredentialsSecretRef != nil {
		names = append(names, string(sr.CredentialsSecretRef.Name))
	}
	for _, f := range registryTLSFiles(relay.Spec.Publish.SchemaRegistry) {
		names = append(names, string(f.ref.Name))
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// errSecret is a Secret that is missing or lacks a key; its message names the Secret and key only.
type errSecret struct {
	reason string // v1alpha1.ReasonSecretNotFound or ReasonSecretKeyMissing
	msg    string
}

func (e *errSecret) Error() string { return e.msg }

// readSecretKey reads one key of a Secret of the OutboxRelay's namespace. The operator caches
// Secret metadata only, so the Secret is read through the uncached reader, once per pass: the
// pass keeps what it read (scope.secrets) for the other keys it needs.
func (r *OutboxRelayReconciler) readSecretKey(ctx context.Context, sc *scope, name, key string) ([]byte, error) {
	s, ok := sc.secrets[name]
	if !ok {
		s = &corev1.Secret{}
		if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: sc.relay.Namespace, Name: name}, s); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, &errSecret{v1alpha1.ReasonSecretNotFound, fmt.Sprintf("Secret %q not found", name)}
			}
			return nil, fmt.Errorf("while reading Secret %q: %w", name, err)
		}
		if sc.secrets == nil {
			sc.secrets = map[string]*corev1.Secret{}
		}
		sc.secrets[name] = s
	}
	v, ok := s.Data[key]
	if !ok || len(v) == 0 {
		return nil, &errSecret{v1alpha1.ReasonSecretKeyMissing, fmt.Sprintf("Secret %q has no key %q", name, key)}
	}
	return v, nil
}

// kafkaSecretEntries reads the TLS and SASL Secret values the relays use, for the secret hash.
func (r *OutboxRelayReconciler) kafkaSecretEntries(ctx context.Context, s *scope) (map[string][]byte, error) {
	kafka := s.relay.Spec.Kafka
	var creds *v1alpha1.SASLSecretRef
	if kafka.SASL != nil {
		creds = &kafka.SASL.SecretRef
	}
	return r.credentialEntries(ctx, s, tlsFiles(kafka.TLS), creds)
}

// credentialEntries reads the Secret values of files and of creds' username and password (nil:
// none), keyed name/key, for the secret hash.
func (r *OutboxRelayReconciler) credentialEntries(ctx context.Context, s *scope, files []tlsFile, creds *v1alpha1.SASLSecretRef) (map[string][]byte, error) {
	out := map[string][]byte{}
	read := func(name, key string) error {
		v, err := r.readSecretKey(ctx, s, name, key)
		if err != nil {
			return err
		}
		out[name+"/"+key] = v
		return nil
	}
	for _, f := range files {
		if err := read(string(f.ref.Name), string(f.ref.Key)); err != nil {
			return nil, err
		}
	}
	if creds != nil {
		uk, pk := creds.Keys()
		for _, k := range []string{uk, pk} {
			if err := read(string(creds.Name), k); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}
