// Package plugin is `kubectl outbox`, the operator's kubectl plugin (binary kubectl-outbox): it
// finds an OutboxRelay through the Kubernetes API, reads the database URL from the Secret the
// relay names with the user's own RBAC, and talks to PostgreSQL directly (docs/operating.md).
//
// Each command lives in the file named after it and registers itself (register, in its init):
// adding a command is adding one file.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"

	"github.com/spf13/cobra"

	"github.com/outbox-operator/outbox-operator/internal/redact"
)

// command builds one subcommand of kubectl outbox over the shared options.
type command struct {
	order int // place in the help's list
	build func(o *Options) *cobra.Command
}

var commands []command

// Version is the plugin's version (kubectl outbox --version), set by its main.
var Version = "dev"

// register adds a subcommand; each command's file calls it from init.
func register(order int, build func(o *Options) *cobra.Command) {
	commands = append(commands, command{order: order, build: build})
}

// Options are the flags every command shares, and where it writes.
type Options struct {
	Kubeconfig string
	Context    string
	Namespace  string
	Output     string

	Out, ErrOut io.Writer

	// red hides the database URL and password from every error, once the Secret was read.
	red *redact.Redactor
}

// NewCommand returns the root command, kubectl outbox, with every registered subcommand.
func NewCommand(out, errOut io.Writer) (*cobra.Command, *Options) {
	o := &Options{Out: out, ErrOut: errOut}
	root := &cobra.Command{
		Use:   "kubectl-outbox",
		Short: "Operate outbox relays: status, stuck events, retry, skip, published, replay",
		Long: `kubectl outbox operates the transactional-outbox relays of outbox-operator.

It finds the OutboxRelay, reads the database URL from the Secret its spec.database.secretRef
names (with your own RBAC: you need "get" on that Secret), and reads and writes the outbox
tables directly. Every act that changes an event is recorded with who, when and why.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       Version,
		// kubectl runs kubectl-outbox as `kubectl outbox`: the help says so.
		Annotations: map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl outbox"},
	}
	cobra.EnableCommandSorting = false // the commands in their registered order
	root.SetOut(out)
	root.SetErr(errOut)
	f := root.PersistentFlags()
	f.StringVar(&o.Kubeconfig, "kubeconfig", "", "path to the kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
	f.StringVar(&o.Context, "context", "", "the kubeconfig context to use")
	f.StringVarP(&o.Namespace, "namespace", "n", "", "the namespace of the OutboxRelay (default: the context's)")
	f.StringVarP(&o.Output, "output", "o", "table", "output format: table, json or yaml")
	sort.SliceStable(commands, func(i, j int) bool { return commands[i].order < commands[j].order })
	for _, c := range commands {
		root.AddCommand(c.build(o))
	}
	return root, o
}

// Execute runs kubectl outbox with args and returns the process exit status; errors go to
// errOut with every secret redacted.
func Execute(ctx context.Context, args []string, out, errOut io.Writer) int {
	root, o := NewCommand(out, errOut)
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(errOut, "error: "+o.red.Error(err))
		var u usageError
		if errors.As(err, &u) {
			return 2
		}
		return 1
	}
	return 0
}

// usageError is bad input: the command did nothing.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{msg: fmt.Sprintf(format, args...)} }
