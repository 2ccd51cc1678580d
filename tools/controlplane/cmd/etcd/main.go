// etcd at the version Kubernetes pins, built from its Go module so the
// local control plane needs nothing but the module proxy.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
