// PostgreSQL's snapshots (pg_snapshot) in text form, xmin:xmax:xip,...: both trackers read them,
// row tracking for the transactions its resume position watches, snapshot tracking for its batches.

package relay

import (
	"fmt"
	"strconv"
	"strings"
)

// parseSnapshot returns the xmax and the xip list of a snapshot in text form.
func parseSnapshot(s string) (xmax string, xip []string, err error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return "", nil, fmt.Errorf("malformed snapshot %q", s)
	}
	if _, err := strconv.ParseUint(parts[1], 10, 64); err != nil {
		return "", nil, fmt.Errorf("malformed snapshot %q", s)
	}
	if parts[2] != "" {
		xip = strings.Split(parts[2], ",")
	}
	return parts[1], xip, nil
}
