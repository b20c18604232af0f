"""A real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) run as
local processes on loopback, for tests and local development. See docs/cluster.md."""

from ftjob_cluster.bins import K8S_VERSION, ensure_binary, tool_names

__all__ = ["K8S_VERSION", "ensure_binary", "tool_names"]
