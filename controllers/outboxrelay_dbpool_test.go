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
	"errors"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

// A pass reuses the OutboxRelay's handle while its URL stays the same; a new URL or a deleted
// OutboxRelay closes it.
func TestDBPools(t *testing.T) {
	ctx := context.Background()
	var p dbPools
	t.Cleanup(p.closeAll)
	opened := 0
	open := func(ctx context.Context, url string) (*sql.DB, error) {
		opened++
		return OpenDB(ctx, url)
	}
	closed := func(db *sql.DB) bool {
		err := db.PingContext(ctx)
		return err != nil && strings.Contains(err.Error(), "database is closed")
	}
	a := types.NamespacedName{Namespace: "shop", Name: "orders"}
	b := types.NamespacedName{Namespace: "shop", Name: "billing"}
	const url1, url2 = "postgres://u:p@127.0.0.1:1/one", "postgres://u:p@127.0.0.1:1/two"

	db1, err := p.get(ctx, a, url1, open)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := p.get(ctx, a, url1, open); again != db1 || opened != 1 {
		t.Fatalf("same URL: a new handle (opened %d times)", opened)
	}
	other, _ := p.get(ctx, b, url1, open)
	if other == db1 || opened != 2 {
		t.Fatalf("another OutboxRelay shares a handle (opened %d times)", opened)
	}
	db2, _ := p.get(ctx, a, url2, open)
	if db2 == db1 || opened != 3 || !closed(db1) || closed(db2) {
		t.Fatalf("new URL: handle reused or the old one left open (opened %d times)", opened)
	}
	p.forget(a)
	if !closed(db2) || closed(other) {
		t.Fatal("forget closed the wrong handle")
	}
	if _, err := p.get(ctx, a, url1, func(context.Context, string) (*sql.DB, error) { return nil, errors.New("refused") }); err == nil {
		t.Fatal("a failing open returned no error")
	}
	if len(p.m) != 1 {
		t.Fatalf("%d handles kept, want 1 (the failed open keeps none)", len(p.m))
	}
	for k, v := range p.m {
		if k != b || v.sum == [32]byte{} {
			t.Fatalf("kept %v", k)
		}
	}
}
