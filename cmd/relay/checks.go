package main

import (
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// checksCmd shows or sets where bad events are refused (migration 00022): table (the table's four
// CHECKs refuse them at insert) or relay (no CHECKs, a cheaper insert: the relays deal with such
// an event from a plain INSERT as poison, reason invalid; a new table's default,
// outboxdb.NewTableChecks).
var checksCmd = checksTrigger.run

// checksTrigger is checksCmd's table setting; relay migrate sets it on a new table.
var checksTrigger = triggerCommand{
	name: "checks", on: "table", off: "relay",
	read: outboxdb.Checks, set: outboxdb.SetChecks,
	sayOn: func(outboxdb.Table) string {
		return "(its CHECKs refuse an empty aggregate type, aggregate id or event type, and headers that are not an object, at insert)"
	},
	sayOff: func(outboxdb.Table) string {
		return "(no CHECKs: PostgreSQL accepts such an event from a plain INSERT, and the relays deal with it as poison, reason invalid)"
	},
}
