package main

import (
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// wakeupsCmd shows or sets how the relays of a table wake up (docs/architecture.md "Wake-ups"):
// poll (the default: no trigger, writers pay nothing, the relays look every --poll-interval) or
// notify (the insert trigger notifies a waiting relay; run the relays with --notify).
var wakeupsCmd = triggerCommand{
	name: "wakeups", on: "notify", off: "poll",
	read: outboxdb.Notifies, set: outboxdb.SetNotify,
	sayOn:  func(outboxdb.Table) string { return "(inserts notify a waiting relay)" },
	sayOff: func(outboxdb.Table) string { return "(no insert trigger: run the relays without --notify)" },
}.run

// wakeupsName names a wake-up mode as relay wakeups does.
func wakeupsName(notify bool) string {
	if notify {
		return "notify"
	}
	return "poll"
}
