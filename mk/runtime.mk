# In-pod training runtime (runtime/finetune_runtime, docs/runtime.md): real 2-rank torchrun and mpirun
# trainings on CPU with the tiny models and the sample data under examples/.
.PHONY: runtime-deps impi versitygw typecheck-runtime test-runtime test-runtime-fast test-runtime-tf457 runtime-vocab runtime-samples

TF457_VENV := $(ROOT)/.venv-tf457

runtime-deps: ## Debian packages the runtime tests use (MPICH, OpenMPI, OpenSSH: hack/tier-packages.txt)
	$(ROOT)/hack/apt-install.sh --tier test-runtime

# Intel MPI for the tests: the impi-rt wheels the xeon images pin (images/xeon/requirements-*.txt, so the tests
# run exactly the images' versions), each in a venv of its own, .venv-impi/<version>: the wheel's bin/ holds a
# `mpirun` that must not shadow Debian's on anyone's PATH. 2021.19 needs libfabric>=2.6, which PyPI lacks.
IMPI_DIR := $(ROOT)/.venv-impi
IMPI_VERSIONS := $(sort $(shell sed -n 's/^impi-rt==//p' $(ROOT)/images/xeon/requirements-*.txt))

$(IMPI_DIR)/%/.stamp: $(UV)
	[ -x $(IMPI_DIR)/$*/bin/python ] || $(UV) venv --python 3.11 $(IMPI_DIR)/$*
	VIRTUAL_ENV=$(IMPI_DIR)/$* $(UV) pip install "impi-rt==$*"
	$(UV_PRUNE)
	touch $@

impi: $(foreach v,$(IMPI_VERSIONS),$(IMPI_DIR)/$(v)/.stamp) ## Intel MPI runtimes (impi-rt, the xeon images' versions) in .venv-impi/

# versitygw, a real S3 server for the S3 checkpoint tests (tests/support/s3server.py), built from its Go module at
# the version tests/support/tierdeps.py pins, cached like the Kubernetes binaries.
FTJOB_CACHE ?= $(HOME)/.cache/finetune-operator
VERSITYGW_VERSION := $(shell sed -n 's/^VERSITYGW_VERSION = "\(.*\)"/\1/p' $(ROOT)/tests/support/tierdeps.py)
VERSITYGW := $(FTJOB_CACHE)/versitygw/$(VERSITYGW_VERSION)/bin/versitygw

$(VERSITYGW):
	@command -v go >/dev/null || { echo "building versitygw needs the Go toolchain (as the control plane does)" >&2; exit 1; }
	GOBIN=$(dir $@).tmp CGO_ENABLED=0 go install -trimpath github.com/versity/versitygw/cmd/versitygw@$(VERSITYGW_VERSION)
	mv $(dir $@).tmp/versitygw $@ && rmdir $(dir $@).tmp

versitygw: $(VERSITYGW) ## S3 server for the runtime tier's S3 checkpoint tests (versitygw, built from its Go module, cached)

typecheck-runtime: setup ## mypy --strict on the runtime package
	$(VENV)/bin/mypy --strict runtime/finetune_runtime

test-runtime: setup runtime-deps impi versitygw typecheck-runtime ## Runtime tier: units, samples, 2-rank torchrun/mpirun trainings, resume, precompile
	$(PY) -m pytest -q tests/runtime

test-runtime-fast: setup runtime-deps impi versitygw ## Runtime tier without the trainings (marker `slow` deselected)
	$(PY) -m pytest -q tests/runtime -m "not slow"

# The neuron image's Hugging Face side (transformers 4.57, the newest release the Neuron stack pins; docs/runtime.md)
# with the dev venv's torch and test tools: requirements/tf457.lock (hack/lock.py). The uv cache hardlinks torch,
# so this second venv is cheap. The operator package is installed too: tests/runtime renders the samples' config
# through its admission and builders, exactly as the pods get it.
TF457_LOCK := requirements/tf457.lock
$(TF457_VENV)/.stamp: $(UV) $(UNIDIC_WHEEL) $(TF457_LOCK) VERSION $(addsuffix /pyproject.toml,$(DEV_PACKAGES))
	[ -x $(TF457_VENV)/bin/python ] || $(UV) venv --python 3.11 $(TF457_VENV)
	$(call LOCK_SYNC,$(TF457_VENV),$(TF457_LOCK))
	touch $@

test-runtime-tf457: $(TF457_VENV)/.stamp runtime-deps impi versitygw ## Runtime units + QA/demo/causal-lm LoRA trainings under transformers 4.57
	$(TF457_VENV)/bin/python -m pytest -q tests/runtime -m "not slow or tf457"

runtime-vocab: setup ## Rebuild the tiny models' tokenizers (vocab.txt / tokenizer.json, vocab_size) from the sample data
	$(VENV)/bin/ftjob-runtime build-vocab --lang ja --input examples/data/ja-reviews/train.jsonl \
	  examples/data/ja-reviews/validation.jsonl --field review_body --vocab-size 3000 --output examples/models/tiny-bert-ja
	$(VENV)/bin/ftjob-runtime build-vocab --lang en --input examples/data/squad-mini/train.json \
	  examples/data/squad-mini/validation.json --vocab-size 3000 --output examples/models/tiny-distilbert-en
	$(VENV)/bin/ftjob-runtime build-vocab --lang en --kind bpe --input examples/data/instruct-mini/train.jsonl \
	  examples/data/instruct-mini/validation.jsonl --field messages --vocab-size 600 --output examples/models/tiny-llama

runtime-samples: ## Regenerate the sample data we wrote (ja-reviews, squad-mini, instruct-mini) from their scripts
	python3 examples/data/ja-reviews/compose_reviews.py
	python3 examples/data/squad-mini/compose_squad.py
	python3 examples/data/instruct-mini/compose_instruct.py

TEST_TIERS += test-runtime test-runtime-tf457
