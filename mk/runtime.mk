# In-pod training runtime (runtime/finetune_runtime, docs/runtime.md): real 2-rank torchrun and mpirun
# trainings on CPU with the tiny models and the sample data under examples/.
.PHONY: runtime-deps typecheck-runtime test-runtime test-runtime-fast test-runtime-tf457 runtime-vocab runtime-samples

RUNTIME_APT := mpich openmpi-bin openssh-server openssh-client
TF457_VENV := $(ROOT)/.venv-tf457

runtime-deps: ## Debian packages the runtime tests use (MPICH, OpenMPI, OpenSSH)
	$(ROOT)/hack/apt-install.sh $(RUNTIME_APT)

typecheck-runtime: setup ## mypy --strict on the runtime package
	$(VENV)/bin/mypy --strict runtime/finetune_runtime

test-runtime: setup runtime-deps typecheck-runtime ## Runtime tier: units, samples, 2-rank torchrun/mpirun trainings, resume, precompile
	$(PY) -m pytest -q tests/runtime

test-runtime-fast: setup ## Runtime tier without the trainings (marker `slow` deselected)
	$(PY) -m pytest -q tests/runtime -m "not slow"

# transformers 4.57 is the newest release the Neuron stack pins (docs/runtime.md); the uv cache hardlinks torch,
# so this second venv is cheap.
$(TF457_VENV)/.stamp: $(UV) runtime/pyproject.toml
	[ -x $(TF457_VENV)/bin/python ] || $(UV) venv --python 3.11 $(TF457_VENV)
	VIRTUAL_ENV=$(TF457_VENV) $(UV) pip install -e runtime "transformers==4.57.*" "pytest>=9" pytest-timeout hypothesis
	touch $@

test-runtime-tf457: $(TF457_VENV)/.stamp runtime-deps ## Runtime units + QA/demo trainings under transformers 4.57
	$(TF457_VENV)/bin/python -m pytest -q tests/runtime -m "not slow or tf457"

runtime-vocab: setup ## Rebuild the tiny models' vocab.txt (and vocab_size) from the sample data
	$(VENV)/bin/ftjob-runtime build-vocab --lang ja --input examples/data/ja-reviews/train.jsonl \
	  examples/data/ja-reviews/validation.jsonl --field review_body --vocab-size 3000 --output examples/models/tiny-bert-ja
	$(VENV)/bin/ftjob-runtime build-vocab --lang en --input examples/data/squad-mini/train.json \
	  examples/data/squad-mini/validation.json --vocab-size 3000 --output examples/models/tiny-distilbert-en

runtime-samples: ## Regenerate the sample data we wrote (ja-reviews, squad-mini) from their scripts
	python3 examples/data/ja-reviews/compose_reviews.py
	python3 examples/data/squad-mini/compose_squad.py

TEST_TIERS += test-runtime test-runtime-tf457
