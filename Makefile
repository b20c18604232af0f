# finetune-operator — `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help
ROOT := $(abspath $(dir $(lastword $(MAKEFILE_LIST))))
VENV ?= $(ROOT)/.venv
PY := $(VENV)/bin/python
UV_VERSION := 0.13.8
# uv honours the host CA bundle (TLS-intercepting proxies) with --system-certs (named --native-tls before uv 0.13).
UV := $(VENV)/../.cache/uv-bin/uv
export UV_SYSTEM_CERTS := 1
export UV_CACHE_DIR ?= $(HOME)/.cache/uv
# The venvs install exactly what a lock pins, hash-checked: requirements/dev.lock here, requirements/tf457.lock in
# mk/runtime.mk. `make lock` resolves the locks from what is declared (operator/ and runtime/pyproject.toml,
# requirements/*.txt, images/*/requirements*.txt) and `make lock-check` (part of `make lint`, offline) fails when
# they disagree (hack/lock.py; images/README.md, "Versions and locks").
DEV_LOCK := requirements/dev.lock
# Wheels this Makefile builds once and every venv's install finds (--find-links): unidic-lite (the MeCab dictionary
# the runtime depends on) exists only as an sdist. Behind a TLS-intercepting proxy uv cannot revalidate its cached
# download, so it rebuilt that sdist (a large build tree in its cache) for every new venv, which filled a CI disk
# (docs/cluster.md, "Disk use"). The wheel is built once by pip from the lock's own line, so pip checks the
# sdist against the locked hash; the venvs then take that wheel by version (hack/lock.py setup-file drops the
# sdist's hash from their copy of the lock, or uv would pick and rebuild the sdist again).
WHEELHOUSE := $(HOME)/.cache/finetune-operator/wheels
UNIDIC_LITE_VERSION := $(shell sed -n 's/^unidic-lite==\([^ ]*\).*/\1/p' $(ROOT)/$(DEV_LOCK))
UNIDIC_WHEEL := $(WHEELHOUSE)/unidic_lite-$(UNIDIC_LITE_VERSION)-py3-none-any.whl
UV_PRUNE = $(UV) cache prune -q
# The repository's packages the venvs hold editable (hack/lock.py DEV_PACKAGES: the locks resolve their requirements).
DEV_PACKAGES := $(shell python3 $(ROOT)/hack/lock.py dev-packages)
# $(call LOCK_SYNC,VENV,LOCK): VENV holds exactly LOCK's packages (uv checks each hash the lock gives) and
# DEV_PACKAGES, editable; the cache's unreachable entries are dropped afterwards. --compile-bytecode: without
# it the first `ftjob run` compiles torch and transformers in each of its ranks, and every run does where the
# .pyc cannot be written (PYTHONDONTWRITEBYTECODE, a read-only venv); cost and gain: benchmarks/README.md.
LOCK_SYNC = python3 $(ROOT)/hack/lock.py setup-file $(2) > $(1)/lock.txt && \
  VIRTUAL_ENV=$(1) $(UV) pip sync --compile-bytecode --find-links $(WHEELHOUSE) $(1)/lock.txt && $(UV_PRUNE)

.PHONY: help setup lint lock lock-check format typecheck test test-unit test-local demo clean

help: ## List the targets
	@grep -hE '^[a-zA-Z0-9_.-]+:.*## ' $(MAKEFILE_LIST) | sort -u | awk -F':.*## ' '{printf "  %-22s %s\n", $$1, $$2}'

$(UV):
	python3 -m pip install -q --target $(ROOT)/.cache/uv-pkg uv==$(UV_VERSION)
	mkdir -p $(dir $(UV)) && ln -sf $(ROOT)/.cache/uv-pkg/bin/uv $(UV)

# Built in a temporary folder and moved: an interrupted build never leaves a truncated wheel behind. --require-hashes:
# pip builds it only from the sdist whose hash the lock names.
$(UNIDIC_WHEEL):
	mkdir -p $(WHEELHOUSE) && tmp=$$(mktemp -d $(WHEELHOUSE)/.build-XXXXXX) && \
	  python3 hack/lock.py pin $(DEV_LOCK) unidic-lite > $$tmp/pin.txt && \
	  python3 -m pip wheel -q --no-deps --no-cache-dir --require-hashes --wheel-dir $$tmp -r $$tmp/pin.txt && \
	  mv $$tmp/$(notdir $@) $@ && rm -rf $$tmp

$(VENV)/.stamp: $(UV) $(UNIDIC_WHEEL) $(DEV_LOCK) VERSION $(addsuffix /pyproject.toml,$(DEV_PACKAGES))
	[ -x $(PY) ] || $(UV) venv --python 3.11 $(VENV)
	$(call LOCK_SYNC,$(VENV),$(DEV_LOCK))
	touch $@

setup: $(VENV)/.stamp ## Create .venv from requirements/dev.lock: both packages (editable), test and lint tools

lock: $(UV) ## Re-resolve every lock from the declared requirements (network); UPGRADE=1, or UPGRADE_PACKAGE=name, to bump
	UV=$(UV) python3 hack/lock.py lock $(if $(UPGRADE),--upgrade) $(addprefix --upgrade-package ,$(UPGRADE_PACKAGE))

lock-check: setup ## Fail when a lock disagrees with the declared requirements (offline; `make lock` fixes it)
	$(PY) hack/lock.py check

PY_SOURCES := operator runtime tests tools benchmarks hack

lint: setup lock-check ## ruff lint and ruff format --check on all Python code (`make format` rewrites), lock-check
	$(VENV)/bin/ruff check $(PY_SOURCES)
	$(VENV)/bin/ruff format --check $(PY_SOURCES)

format: setup ## Format all Python code with ruff (the style `make lint` enforces)
	$(VENV)/bin/ruff format $(PY_SOURCES)

typecheck: setup ## mypy --strict on the operator package
	$(VENV)/bin/mypy --strict operator/finetune_operator

test-unit: setup ## Unit tests: builders, profiles, validation, reconcile (no cluster)
	$(PY) -m pytest -q tests/unit

demo: setup ## Fine-tune the tiny Japanese sentiment BERT locally (2 ranks, torchrun) and print metrics
	rm -rf _out/demo
	$(VENV)/bin/ftjob run -f examples/jobs/demo-ja-sentiment.yaml --workdir _out/demo

test-local: setup impi ## `ftjob run` tier: real local torchrun and MPI (MPICH, OpenMPI, Intel MPI) runs with the pods' environment
	./hack/apt-install.sh --tier test-local
	$(PY) -m pytest -q tests/local
TEST_TIERS += test-local

clean: ## Remove build outputs (keeps the venv and caches)
	rm -rf _out .pytest_cache .mypy_cache .ruff_cache

-include $(sort $(wildcard mk/*.mk))

# Each mk/<area>.mk appends its tier to TEST_TIERS; prerequisites expand here, after the includes.
test: lint typecheck test-unit $(TEST_TIERS) ## Every test tier this machine can run
