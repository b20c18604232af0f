# Kueue tier: a real Kueue (built from sigs.k8s.io/kueue) queueing FineTuneJobs on the local control plane
# (tests/controlplane/test_kueue.py, docs/operator.md "Kueue", docs/cluster.md "Kueue").
.PHONY: kueue-bin test-kueue

kueue-bin: ## Build Kueue's manager from its Go module (tools/cluster/kueue; cached per version)
	$(CLUSTER_TOOL) bin kueue

test-kueue: setup k8s-bins kueue-bin ## Kueue tier: quota, admission, flavors, eviction, restarts and deletion with a real Kueue
	$(PY) -m pytest -q tests/controlplane/test_kueue.py
TEST_TIERS += test-kueue
