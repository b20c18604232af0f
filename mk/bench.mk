# Benchmarks: numbers, never pass/fail (see benchmarks/README.md). Not part of `make test`.
BENCH_JOBS ?= 50
BENCH_OUT ?= benchmarks/results/latest

.PHONY: bench bench-render bench-operator

bench: bench-render bench-operator ## Every benchmark; results as JSON under benchmarks/results/latest (BENCH_OUT)

bench-render: setup ## Pure builders: renders per second for every sample
	$(PY) benchmarks/render.py --json $(BENCH_OUT)/render.json

bench-operator: setup k8s-bins ## Operator vs raw API on a real control plane (BENCH_JOBS jobs, audit-log request counts)
	$(PY) benchmarks/operator_scale.py --jobs $(BENCH_JOBS) --json $(BENCH_OUT)/operator-scale.json
