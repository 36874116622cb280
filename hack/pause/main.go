// Command pause is the pod sandbox process of the test cluster that hack/cluster.sh runs
// (containerd's sandbox_image is built from it, there being no image registry to pull
// registry.k8s.io/pause from). Like the upstream pause it sleeps until SIGINT or SIGTERM and,
// being PID 1 of the pod's PID namespace when the namespace is shared, reaps orphaned children.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && (os.Args[1] == "-v" || os.Args[1] == "--version") {
		fmt.Println("outbox-operator pause")
		return
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
