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

// Condition types have positive polarity: True is good. Reasons are stable UpperCamelCase
// constants; messages never carry timestamps, generated names or secrets.

// Ready is the AND of the other conditions. When it is not True its reason is the reason of the
// first condition (in the order below) that is not True, and its message names that condition.
const (
	ConditionReady = "Ready"

	// ReasonReady: every other condition is True.
	ReasonReady = "Ready"
)

// MigrationsApplied: the database is reachable and the outbox table's schema is at the latest
// migration version.
const (
	ConditionMigrationsApplied = "MigrationsApplied"

	// ReasonMigrationsApplied: the schema is at the latest version.
	ReasonMigrationsApplied = "MigrationsApplied"
	// ReasonSecretNotFound: a Secret the spec refers to does not exist.
	ReasonSecretNotFound = "SecretNotFound"
	// ReasonConfigMapNotFound: a ConfigMap the spec refers to does not exist (or is empty).
	ReasonConfigMapNotFound = "ConfigMapNotFound"
	// ReasonSecretKeyMissing: a Secret the spec refers to lacks the key.
	ReasonSecretKeyMissing = "SecretKeyMissing"
	// ReasonInvalidDatabaseURL: the Secret's value is not a libpq URL.
	ReasonInvalidDatabaseURL = "InvalidDatabaseURL"
	// ReasonInvalidTable: spec.database.table is not a valid table name.
	ReasonInvalidTable = "InvalidTable"
	// ReasonTableConflict: another, older OutboxRelay already relays the same table of the same database.
	ReasonTableConflict = "TableConflict"
	// ReasonDatabaseUnreachable: the database refused or did not answer.
	ReasonDatabaseUnreachable = "DatabaseUnreachable"
	// ReasonMigrationFailed: applying a migration failed.
	ReasonMigrationFailed = "MigrationFailed"
	// ReasonSchemaNewer: the table's schema is newer than this operator knows.
	ReasonSchemaNewer = "SchemaNewerThanOperator"
)

// PartitionsReady: the daily partitions from today through premakeDays exist and partitions past
// retention were dropped.
const (
	ConditionPartitionsReady = "PartitionsReady"

	// ReasonPartitionsReady: the partitions are as the spec asks.
	ReasonPartitionsReady = "PartitionsReady"
	// ReasonPartitionMaintenanceFailed: creating, listing or dropping partitions failed.
	ReasonPartitionMaintenanceFailed = "PartitionMaintenanceFailed"
	// ReasonRetentionBlocked: a partition past retention holds unsent events, so it is kept.
	ReasonRetentionBlocked = "RetentionBlockedByUnsentEvents"
)

// Event reasons of the table's wake-ups (spec.publish.notify): the insert trigger created or
// dropped, or a change that could not take the table's lock in time (retried).
const (
	ReasonWakeupsChanged = "WakeupsChanged"
	ReasonWakeupsFailed  = "WakeupsChangeFailed"
)

// Event reasons of spec.writers.plainInserts: the lock trigger created or dropped, or a change
// that could not take the table's lock in time (retried).
const (
	ReasonInsertsChanged = "PlainInsertsChanged"
	ReasonInsertsFailed  = "PlainInsertsChangeFailed"
)

// Event reasons of spec.writers.checks: the table's CHECKs dropped or added back, or a change
// that could not take the table's lock in time (retried).
const (
	ReasonChecksChanged = "ChecksChanged"
	ReasonChecksFailed  = "ChecksChangeFailed"
)

// Event reasons of the tracking mode: an unset spec.publish.tracking resolved from the table and
// recorded in status.tracking, a table whose state could not be read for it (retried), and a
// spec that asks to go back from Snapshot to Row (refused: the relays keep Snapshot).
const (
	ReasonTrackingResolved   = "TrackingResolved"
	ReasonTrackingUnresolved = "TrackingUnresolved"
	ReasonTrackingRefused    = "TrackingCannotGoBack"
)

// Event reasons of a deletion under the Drain policy: the relays publish what is pending before
// the OutboxRelay goes, or the drain timeout passes first.
const (
	ReasonDeletionDraining = "DeletionDraining"
	ReasonDrained          = "Drained"
	ReasonDrainTimeout     = "DrainTimedOut"
)

// Event reasons of the table's indexes per tracking mode (outboxdb.ReadPendingIndex): the
// pending index dropped (snapshot tracking) or built (row tracking), or a change that failed
// (retried).
const (
	ReasonIndexesChanged = "IndexesChanged"
	ReasonIndexesFailed  = "IndexesChangeFailed"
)

// RelaysAvailable: one relay Deployment per shard is applied and each has an available pod.
const (
	ConditionRelaysAvailable = "RelaysAvailable"

	// ReasonRelaysAvailable: every shard has an available relay.
	ReasonRelaysAvailable = "RelaysAvailable"
	// ReasonRelaysUnavailable: some shards have no available relay yet.
	ReasonRelaysUnavailable = "RelaysUnavailable"
	// ReasonKafkaUnreachable: relays are not available because no Kafka broker answers them.
	ReasonKafkaUnreachable = "KafkaUnreachable"
	// ReasonKafkaRefused: relays are not available because the Kafka cluster refuses them:
	// credentials (SASL), permissions (ACLs), TLS, or a topic that does not exist.
	ReasonKafkaRefused = "KafkaRefused"
	// ReasonPaused: spec.paused scaled the relays to zero.
	ReasonPaused = "Paused"
	// ReasonDeploymentNotOwned: a Deployment with a relay's name exists and is not controlled by
	// this OutboxRelay; it is left alone.
	ReasonDeploymentNotOwned = "DeploymentNotOwned"
	// ReasonApplyFailed: the API server refused a relay Deployment.
	ReasonApplyFailed = "ApplyFailed"
	// A TLS or SASL Secret that is missing or lacks a key gives RelaysAvailable False with
	// ReasonSecretNotFound or ReasonSecretKeyMissing and a message starting "Kafka settings:".
)

// TopicsReady: the topics the relays publish to exist and are replicated as acks=all expects
// (spec.kafka.topics: Verify or Create; absent under Ignore). It is not part of Ready: the relays'
// own view of Kafka is RelaysAvailable.
const (
	ConditionTopicsReady = "TopicsReady"

	// ReasonTopicsReady: every known topic exists and is sound.
	ReasonTopicsReady = "TopicsReady"
	// ReasonTopicsNotReady: a topic is missing or unsound; the message says which and why.
	ReasonTopicsNotReady = "TopicsNotReady"
	// ReasonTopicsUnknown: the brokers did not answer the operator (or its Kafka settings are
	// incomplete): the topics were not checked.
	ReasonTopicsUnknown = "TopicsUnknown"
	// ReasonTopicCreated: the event of a topic the operator created.
	ReasonTopicCreated = "TopicCreated"
)

// LagWithinTarget: the oldest unsent event is younger than spec.lagTarget seconds.
const (
	ConditionLagWithinTarget = "LagWithinTarget"

	// ReasonLagWithinTarget: lag is at or below the target.
	ReasonLagWithinTarget = "LagWithinTarget"
	// ReasonLagExceeded: lag is above the target.
	ReasonLagExceeded = "LagExceeded"
	// ReasonLagUnknown: lag could not be measured.
	ReasonLagUnknown = "LagUnknown"
)

// ShardsSettled: the shard layout in the database is the desired one (status.desiredShards). It
// is not part of Ready: a change of layout is routine (the autoscaler makes them).
const (
	ConditionShardsSettled = "ShardsSettled"

	// ReasonShardsSettled: the layout has the desired shard count.
	ReasonShardsSettled = "ShardsSettled"
	// ReasonWaitingForRelays: the relays of the new layout are not all up yet; the old layout
	// keeps publishing meanwhile.
	ReasonWaitingForRelays = "WaitingForRelays"
	// ReasonWaitingForIndex: a layout of several shards is desired and the bucket index its
	// shards read is being built (CONCURRENTLY); the current layout keeps publishing meanwhile.
	ReasonWaitingForIndex = "WaitingForIndex"
	// ReasonDraining: the old layout's relays were asked to stand down; the switch waits until
	// none holds a bucket.
	ReasonDraining = "Draining"
	// ReasonResharded: the event of a completed change of layout.
	ReasonResharded = "Resharded"
	// ReasonScaledUp and ReasonScaledDown: the events of the built-in autoscaler's decisions.
	ReasonScaledUp   = "ScaledUp"
	ReasonScaledDown = "ScaledDown"
	// ReasonScaleHeld: the event of the built-in autoscaler not acting on the lag it sees, and why
	// (the relays are not all available, or failed events hold the lag back).
	ReasonScaleHeld = "ScaleHeld"
)

// ReasonNotReconciled is the reason of a condition whose step has not run yet in this generation,
// because an earlier step stopped the pass.
const ReasonNotReconciled = "NotReconciled"

// Reasons of the operator's events that are not also condition reasons (the others use the
// condition's reason).
const (
	ReasonAppliedMigrations     = "AppliedMigrations"
	ReasonCreatedPartitions     = "CreatedPartitions"
	ReasonDroppedPartitions     = "DroppedPartitions"
	ReasonPartitionDropDeferred = "PartitionDropDeferred"
	ReasonResharding            = "Resharding"
	ReasonReshardWithdrawn      = "ReshardWithdrawn"
	ReasonSwitchedLayout        = "SwitchedLayout"
	ReasonDeletedSurplusShard   = "DeletedSurplusShard"
	// ReasonGrantedRelayRole: the operator granted the relays' own role (spec.relay.databaseSecretRef)
	// what a relay needs on the table's objects; ReasonRelayGrantFailed: it could not.
	ReasonGrantedRelayRole = "GrantedRelayRole"
	ReasonRelayGrantFailed = "RelayGrantFailed"
)

// SubConditions are the conditions Ready is computed from, in order.
var SubConditions = []string{
	ConditionMigrationsApplied,
	ConditionPartitionsReady,
	ConditionRelaysAvailable,
	ConditionLagWithinTarget,
}
