# End-to-end tier: two real nodes (kubelet, containerd, runc, CNI and kube-proxy each; CoreDNS) beside the control
# plane, a registry the session releases into, the operator installed by Helm from it as a pod, FineTuneJobs
# applied with kubectl, Prometheus on the host discovering and scraping the operator pods (tests/e2e,
# docs/cluster.md).
.PHONY: node-bins test-e2e

node-bins: ## Build kubelet, kube-proxy (k8s module), CoreDNS and, where the kernel can run it, kube-network-policies (their modules) into the binary cache
	$(CLUSTER_TOOL) build --node

# Where the machine cannot run a node (not root, no cgroups) the tier says why and passes without building.
# A session that passes writes the failure table (the `e2e` section of a reliability document, nothing else in
# it): _out/reliability-e2e.md by default, so that `make test` leaves the committed docs as they were; the
# committed table is regenerated with `make test-e2e E2E_RELIABILITY_OUT=docs/reliability.md`.
E2E_RELIABILITY_OUT ?= $(ROOT)/_out/reliability-e2e.md
test-e2e: setup ## E2E tier: real pods on two kubelet nodes, operator in-cluster via Helm, seed jobs end to end, node faults; writes the failure table (E2E_RELIABILITY_OUT)
	./hack/apt-install.sh --tier test-e2e
	@rc=0; $(CLUSTER_PY) node-check || rc=$$?; \
	  if [ $$rc = 1 ]; then echo "test-e2e skipped"; exit 0; fi; \
	  if [ $$rc != 0 ]; then echo "test-e2e did not run: stop the other node first" >&2; exit 1; fi; \
	  $(MAKE) --no-print-directory k8s-bins node-bins registry-bin prometheus-bin image-cpu image-operator && \
	  mkdir -p $(dir $(E2E_RELIABILITY_OUT)) && \
	  FTJOB_E2E_IMAGE=finetune-operator/cpu:$(IMAGE_TAG) FTJOB_E2E_OPERATOR_IMAGE=finetune-operator/operator:$(OPERATOR_IMAGE_TAG) \
	  FTJOB_E2E_RELIABILITY_OUT=$(E2E_RELIABILITY_OUT) $(PY) -m pytest -q tests/e2e
TEST_TIERS += test-e2e
