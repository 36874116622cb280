package main

import (
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// insertsCmd shows or sets whether plain INSERTs into the table take the aggregate's lock
// (migration 00019): locked (a BEFORE INSERT trigger takes the writer libraries' lock and draws
// the id after it: plain INSERTs keep per-aggregate commit order) or plain (the default: only the
// libraries and <table>_append take it).
var insertsCmd = triggerCommand{
	name: "inserts", on: "locked", off: "plain",
	read: outboxdb.LockedInserts, set: outboxdb.SetLockedInserts,
	sayOn: func(t outboxdb.Table) string {
		return "(a plain INSERT takes its aggregate's lock, as outbox.Append and " + t.Name + "_append do)"
	},
	sayOff: func(t outboxdb.Table) string {
		return "(only outbox.Append and " + t.Name + "_append take the aggregate's lock)"
	},
}.run
