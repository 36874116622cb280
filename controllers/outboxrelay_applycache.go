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

// The apply cache's hash: a Deployment applied with a configuration is not applied again while
// neither the configuration nor the object changed (relayState.applied).

package controllers

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
)

// applyHash hashes an apply configuration before it is sent.
func applyHash(ac any) string {
	data, err := json.Marshal(ac)
	if err != nil {
		return "" // never matches
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}
