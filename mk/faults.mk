# Fault tier (tests/faults, docs/reliability.md): the real operator against the real control plane (mk/cluster.mk)
# while its process is SIGKILLed, the API server restarts, connections are cut or slowed, and a second operator
# races it; plus one test per failure Kubeflow's operators are known for.
.PHONY: test-faults-quick test-faults

test-faults-quick: setup k8s-bins ## Fault tier, quick variant (a few trials each), in `make test`
	./hack/apt-install.sh --tier test-faults-quick
	mkdir -p $(ROOT)/_out
	FTJOB_RELIABILITY_OUT=$(ROOT)/_out/reliability-quick.md $(PY) -m pytest -q tests/faults
TEST_TIERS += test-faults-quick

test-faults: setup k8s-bins ## Fault tier, long variants (50 operator SIGKILL trials, ...); writes docs/reliability.md
	./hack/apt-install.sh --tier test-faults
	FTJOB_FAULTS=long FTJOB_RELIABILITY_OUT=$(ROOT)/docs/reliability.md $(PY) -m pytest -q tests/faults
