// A CoreDNS with only the plugins the real-node flavor's cluster DNS uses
// (issue 16): the default build links every plugin (cloud DNS providers,
// etcd, forward, ...), a much larger and slower build, and `forward` is the
// one plugin this cluster's DNS must never have (nothing resolves through
// the machine's own resolver). Built by e2e/toolchain/realnode.sh.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The directives a Corefile may name, in upstream plugin.cfg's relative
// order (a plugin sees only those after it); any other directive is an
// "unknown directive" error at start-up.
func init() {
	dnsserver.Directives = []string{"bind", "ready", "errors", "log", "kubernetes"}
}

func main() {
	coremain.Run()
}
