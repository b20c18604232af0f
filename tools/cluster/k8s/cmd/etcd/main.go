// Command etcd is the upstream etcd server, built from go.etcd.io/etcd/server/v3 at the version
// pinned in go.mod, so the test control plane needs no downloaded binary.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
