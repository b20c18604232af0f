# Per-hardware container images (images/, tests/images). Docker comes from Debian (docker.io, with BuildKit);
# the daemon is started on demand. Every image is a thin FROM of the shared base (images/base/Dockerfile), which
# images/scripts/build.sh builds first. With no registry reachable, that base starts from a debootstrap'ed Debian.
# Default tag: VERSION, the release version of everything here. The operator gives runtime images its own version
# as their default tag, and the chart's appVersion (its default operator image) is VERSION too, so a locally
# built image is the one a job or the chart pulls.
IMAGE_TAG ?= $(shell cat $(ROOT)/VERSION)
OPERATOR_IMAGE_TAG ?= $(IMAGE_TAG)
# Every build names its platform (build.sh --platform), so the architecture never follows the host's (an arm64
# laptop builds the amd64 images a cluster runs, under emulation); PLATFORM=linux/arm64 for the other one.
# build.sh finds a Docker CLI that builds with BuildKit (images/scripts/docker.sh); DOCKER= picks one.
PLATFORM ?= linux/amd64
IMAGES_FLAVORS := cpu nvidia xeon xeon-upstream neuron neuron-native
IMAGES_DOCKERFILES := $(wildcard images/*/Dockerfile)
IMAGES_SCRIPTS := $(wildcard images/*/*.sh)

.PHONY: images images-docker image-base image-operator lint-images test-images $(addprefix image-,$(IMAGES_FLAVORS))

images-docker: ## Install Docker (docker.io) + debootstrap from Debian and start dockerd when it is not running
	hack/apt-install.sh docker.io debootstrap curl
	images/scripts/dockerd-up.sh

image-base: images-docker ## Shared base images finetune-operator/{base,runtime-base,builder}:bookworm (every image builds them first anyway)
	PLATFORM=$(PLATFORM) images/scripts/build.sh base

# Each flavor: images/scripts/build.sh picks the offline base and the torch index this machine can reach.
$(addprefix image-,$(IMAGES_FLAVORS)): image-%: images-docker
	PLATFORM=$(PLATFORM) IMAGE_TAG=$(IMAGE_TAG) images/scripts/build.sh $*

image-cpu: ## Build finetune-operator/cpu (plain CPU: the image the local cluster and CI run)
image-nvidia: ## Build finetune-operator/nvidia (CUDA torch)
image-xeon: ## Build finetune-operator/xeon (torch 2.7 + IPEX 2.7 + oneccl_bind_pt 2.7; needs Intel's wheel index)
image-xeon-upstream: ## Build finetune-operator/xeon-upstream (current torch, AMX via upstream oneDNN, Intel MPI)
image-neuron: ## Build finetune-operator/neuron (Neuron SDK 2.31; needs the Neuron apt/pip repos and an Ubuntu 24.04 base)
image-neuron-native: ## Build finetune-operator/neuron-native (TorchNeuron, Neuron SDK 2.33; needs the Neuron repos and an Ubuntu 26.04 base)

image-operator: images-docker ## Build finetune-operator/operator (the operator itself: kopf, no torch; the chart's default image)
	PLATFORM=$(PLATFORM) IMAGE_TAG=$(OPERATOR_IMAGE_TAG) images/scripts/build.sh operator

images: $(addprefix image-,$(IMAGES_FLAVORS)) image-operator ## Build every image (neuron and xeon need their vendor repos)

lint-images: setup ## hadolint every Dockerfile, shellcheck the image scripts
	$(VENV)/bin/hadolint --config images/.hadolint.yaml $(IMAGES_DOCKERFILES)
	$(VENV)/bin/shellcheck $(IMAGES_SCRIPTS)

test-images: setup k8s-bins lint-images image-cpu image-operator ## Images tier: lint, build the cpu and operator images (cached), smoke-test them (uid, selfcheck, 2-rank training, operator on a control plane)
	FTJOB_TEST_IMAGE=finetune-operator/cpu:$(IMAGE_TAG) FTJOB_TEST_OPERATOR_IMAGE=finetune-operator/operator:$(OPERATOR_IMAGE_TAG) \
	  $(PY) -m pytest -q tests/images

TEST_TIERS += test-images

# The release (hack/release.py, images/README.md "Release"): every image this machine can build, for PLATFORM,
# pushed to REGISTRY by digest, and the chart with those digests as its defaults pushed to oci://REGISTRY/charts;
# what was pushed is recorded in _out/release/VERSION/release.json. The version is the VERSION file's: to
# release another one, edit VERSION and run `make generate` (hack/version.py stamps the chart and manifests),
# so VERSION= on the command line is refused rather than half applied. RELEASE_IMAGES picks flavors (the
# operator always); xeon and neuron need vendor repositories and are skipped unless RELEASE_ALL=1.
RELEASE_IMAGES ?= operator,cpu,nvidia,xeon-upstream,xeon,neuron
RELEASE_CA_FILE ?=
.PHONY: release
release: setup images-docker ## Build and push the images (by digest) and the chart of VERSION: make release REGISTRY=host[:port][/prefix]
ifeq ($(origin VERSION),command line)
	$(error VERSION=$(VERSION): a release is the VERSION file's version; edit VERSION, run `make generate` and commit, then `make release`)
endif
	@test -n "$(REGISTRY)" || { echo "REGISTRY=host[:port][/prefix] is required (docker login and helm registry login to it first)" >&2; exit 2; }
	$(PY) hack/release.py release --registry "$(REGISTRY)" --images "$(RELEASE_IMAGES)" --platform "$(PLATFORM)" \
	  --helm "$$(tools/cluster/bin/ftjob-tool helm)" $(if $(RELEASE_CA_FILE),--ca-file "$(RELEASE_CA_FILE)") \
	  $(if $(filter 1,$(RELEASE_ALL)),--all)
