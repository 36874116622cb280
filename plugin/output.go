package plugin

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/yaml"
)

// Output formats (-o).
const (
	outputTable = "table"
	outputJSON  = "json"
	outputYAML  = "yaml"
)

// checkOutput refuses an unknown -o before the command does anything.
func (o *Options) checkOutput() error {
	switch o.Output {
	case outputTable, "", outputJSON, outputYAML:
		return nil
	}
	return usagef("-o %q: want table, json or yaml", o.Output)
}

// print writes v as JSON or YAML, or as the tables table writes.
func (o *Options) print(v any, table func(w io.Writer)) error {
	switch o.Output {
	case outputJSON:
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(o.Out, string(b))
		return err
	case outputYAML:
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = o.Out.Write(b)
		return err
	}
	tw := tabwriter.NewWriter(o.Out, 0, 4, 2, ' ', 0)
	table(tw)
	return tw.Flush()
}

// row writes one tab-separated line.
func row(w io.Writer, cells ...any) {
	s := make([]string, len(cells))
	for i, c := range cells {
		s[i] = cell(c)
	}
	fmt.Fprintln(w, strings.Join(s, "\t"))
}

// title writes a line that heads a table: without a tab, so that it ends the tabwriter's column
// block above and does not widen the table's first column.
func title(w io.Writer, k, v string) {
	fmt.Fprintln(w, k+" "+v)
}

// cell formats a table cell: "-" for nothing, times in UTC to the second.
func cell(v any) string {
	switch x := v.(type) {
	case nil:
		return "-"
	case string:
		if x == "" {
			return "-"
		}
		return oneLine(x, 120)
	case *string:
		if x == nil {
			return "-"
		}
		return cell(*x)
	case time.Time:
		if x.IsZero() {
			return "-"
		}
		return x.UTC().Format(time.RFC3339)
	case *time.Time:
		if x == nil {
			return "-"
		}
		return cell(*x)
	case *int64:
		if x == nil {
			return "-"
		}
		return fmt.Sprint(*x)
	}
	return fmt.Sprint(v)
}

// oneLine keeps a table on one line per row: newlines become spaces, and long text ends in "...".
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		return s[:n-3] + "..."
	}
	return s
}

// age formats a duration the way kubectl does: the two largest units.
func age(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
}

// bytesIEC formats a size in bytes with binary units.
func bytesIEC(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
