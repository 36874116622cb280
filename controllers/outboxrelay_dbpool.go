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
	"crypto/sha256"
	"database/sql"
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// dbPools keeps one database handle per OutboxRelay from pass to pass, so that the pass that
// runs every lag polling interval reuses its connections instead of dialing the database anew.
// A handle is kept with the SHA-256 of its URL (never the URL itself): when the Secret's URL
// changes, the old handle is closed and a new one opened.
type dbPools struct {
	mu sync.Mutex
	m  map[types.NamespacedName]pooledDB
}

type pooledDB struct {
	sum [sha256.Size]byte
	db  *sql.DB
}

// get returns the handle of key for url, opening it with open when there is none or the URL
// changed.
func (p *dbPools) get(ctx context.Context, key types.NamespacedName, url string,
	open func(context.Context, string) (*sql.DB, error)) (*sql.DB, error) {
	sum := sha256.Sum256([]byte(url))
	p.mu.Lock()
	defer p.mu.Unlock()
	if cur, ok := p.m[key]; ok {
		if cur.sum == sum {
			return cur.db, nil
		}
		_ = cur.db.Close()
		delete(p.m, key)
	}
	db, err := open(ctx, url)
	if err != nil {
		return nil, err
	}
	if p.m == nil {
		p.m = map[types.NamespacedName]pooledDB{}
	}
	p.m[key] = pooledDB{sum: sum, db: db}
	return db, nil
}

// forget closes the handle of a deleted OutboxRelay.
func (p *dbPools) forget(key types.NamespacedName) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if cur, ok := p.m[key]; ok {
		_ = cur.db.Close()
		delete(p.m, key)
	}
}

// closeAll closes every handle (the manager is stopping).
func (p *dbPools) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for key, cur := range p.m {
		_ = cur.db.Close()
		delete(p.m, key)
	}
}
