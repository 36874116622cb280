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

package controllers

import (
	"context"
	"database/sql"
	"maps"
	"slices"

	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// relaysKafkaState returns what the relays holding the table's shards (outboxdb.ReadRelayLocks'
// presence locks) report of Kafka in their lock connections' application_name
// (contract.RelayStateName): refused if any says so, else unreachable if any says so, else ""
// (also when the database cannot tell).
func relaysKafkaState(ctx context.Context, db *sql.DB, t outboxdb.Table) string {
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	locks, err := outboxdb.ReadRelayLocks(ctx, db, t)
	if err != nil || len(locks.Present) == 0 {
		return ""
	}
	pids := slices.Collect(maps.Values(locks.Present))
	rows, err := db.QueryContext(ctx, `SELECT application_name FROM pg_stat_activity WHERE pid = ANY($1::int4[])`, pids)
	if err != nil {
		return ""
	}
	defer rows.Close()
	state := ""
	for rows.Next() {
		var name string
		if rows.Scan(&name) != nil {
			return ""
		}
		switch contract.RelayState(name) {
		case contract.RelayKafkaRefused:
			state = contract.RelayKafkaRefused
		case contract.RelayKafkaUnreachable:
			if state == "" {
				state = contract.RelayKafkaUnreachable
			}
		}
	}
	return state
}
