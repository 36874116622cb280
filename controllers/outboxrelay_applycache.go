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

// The apply cache: a Deployment applied with a configuration is not applied again while neither
// the configuration nor the object changed.

package controllers

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"sync"

	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
)

// applyCache remembers, per Deployment, the hash of the last applied configuration and the
// resourceVersion the API server returned for it (as CAPI's ssa.Cache does).
type applyCache struct {
	mu sync.Mutex
	m  map[string][2]string
}

func (c *applyCache) unchanged(key, hash, resourceVersion string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.m[key]
	return ok && resourceVersion != "" && v == [2]string{hash, resourceVersion}
}

func (c *applyCache) record(key, hash, resourceVersion string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string][2]string{}
	}
	c.m[key] = [2]string{hash, resourceVersion}
}

func (c *applyCache) forget(prefix string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.m {
		if strings.HasPrefix(k, prefix) {
			delete(c.m, k)
		}
	}
}

// applyHash hashes an apply configuration before it is sent.
func applyHash(ac *appsv1ac.DeploymentApplyConfiguration) string {
	data, err := json.Marshal(ac)
	if err != nil {
		return "" // never matches
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}
