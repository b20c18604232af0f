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
# Wheels this Makefile builds once and every venv's install finds (--find-links): unidic-lite (the MeCab dictionary
# the runtime depends on) exists only as an sdist. Behind a TLS-intercepting proxy uv cannot revalidate its cached
# download, so it rebuilt that sdist for every new venv and kept each build until the disk filled (docs/cluster.md,
# "Disk use"). UV_INSTALL is the one install command; it drops the cache's unreachable entries afterwards.
WHEELHOUSE := $(HOME)/.cache/finetune-operator/wheels
UNIDIC_LITE_VERSION := 1.0.8
UNIDIC_WHEEL := $(WHEELHOUSE)/unidic_lite-$(UNIDIC_LITE_VERSION)-py3-none-any.whl
UV_INSTALL = $(UV) pip install --find-links $(WHEELHOUSE)
UV_PRUNE = $(UV) cache prune -q

.PHONY: help setup lint format typecheck test test-unit test-local demo clean

help: ## List the targets
	@grep -hE '^[a-zA-Z0-9_.-]+:.*## ' $(MAKEFILE_LIST) | sort -u | awk -F':.*## ' '{printf "  %-22s %s\n", $$1, $$2}'

$(UV):
	python3 -m pip install -q --target $(ROOT)/.cache/uv-pkg uv==$(UV_VERSION)
	mkdir -p $(dir $(UV)) && ln -sf $(ROOT)/.cache/uv-pkg/bin/uv $(UV)

# Built in a temporary folder and moved: an interrupted build never leaves a truncated wheel behind.
$(UNIDIC_WHEEL):
	mkdir -p $(WHEELHOUSE) && tmp=$$(mktemp -d $(WHEELHOUSE)/.build-XXXXXX) && \
	  python3 -m pip wheel -q --no-deps --no-cache-dir --wheel-dir $$tmp unidic-lite==$(UNIDIC_LITE_VERSION) && \
	  mv $$tmp/$(notdir $@) $@ && rm -rf $$tmp

# Editable: the two packages, the cluster tool (tools/cluster) and the test support (tests/support) every tier imports.
DEV_PACKAGES := operator runtime tools/cluster tests/support

$(VENV)/.stamp: $(UV) $(UNIDIC_WHEEL) $(addsuffix /pyproject.toml,$(DEV_PACKAGES)) $(wildcard requirements/*.txt)
	[ -x $(PY) ] || $(UV) venv --python 3.11 $(VENV)
	VIRTUAL_ENV=$(VENV) $(UV_INSTALL) $(addprefix -e ,$(DEV_PACKAGES)) $(addprefix -r ,$(wildcard requirements/*.txt))
	$(UV_PRUNE)
	touch $@

setup: $(VENV)/.stamp ## Create .venv with both packages, the cluster tool and the test support (editable), test and lint tools

PY_SOURCES := operator runtime tests tools benchmarks hack

lint: setup ## ruff lint and ruff format --check on all Python code (`make format` rewrites)
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
