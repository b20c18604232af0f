# Benchmarks: numbers, never pass/fail (see benchmarks/README.md). Not part of `make test`.
# QUICK=1 (or `make bench-quick`): every benchmark in a short form (how long each takes: benchmarks/README.md).
BENCH_JOBS ?= $(if $(QUICK),20,200)
BENCH_OUT ?= benchmarks/results/latest
BENCH_QUICK := $(if $(QUICK),--quick,)

BENCH_PEER_JOBS ?= $(if $(QUICK),20,200)
BENCH_PEER_ROUNDS ?= 1

.PHONY: bench bench-quick bench-render bench-request-cost bench-operator bench-runtime bench-data bench-compile-cache bench-failover bench-gpu bench-xeon-stacks bench-peer peer-bin

bench: bench-render bench-data bench-runtime $(if $(QUICK),,bench-compile-cache) bench-request-cost bench-operator $(if $(QUICK),,bench-failover) ## Every benchmark but the Kubeflow peer comparison (make bench-peer, the longest: run it alone); results as JSON under benchmarks/results/latest (BENCH_OUT); QUICK=1 for the short set

bench-quick: ## The whole benchmark set in its short form (make bench QUICK=1)
	$(MAKE) bench QUICK=1

bench-render: setup ## Pure builders: renders per second for every sample
	$(PY) benchmarks/render.py $(if $(QUICK),--seconds 0.5,) --json $(BENCH_OUT)/render.json

bench-request-cost: setup k8s-bins ## API server + etcd CPU per request kind (children, Event, FineTuneJob create, status patch): the floor under ours:raw
	$(PY) benchmarks/request_cost.py --requests $(if $(QUICK),50,200) --json $(BENCH_OUT)/request-cost.json

bench-operator: setup k8s-bins ## Operator vs raw API on a real control plane: BENCH_JOBS (200) jobs, a 64-rank job, the steady state of the jobs training, deletion; BENCH_JOBS=1000 for the large run
	$(PY) benchmarks/operator_scale.py --jobs $(BENCH_JOBS) $(if $(QUICK),--window 35,) --json $(BENCH_OUT)/operator-scale.json

bench-runtime: setup ## Our runtime vs a bare HF Trainer script, A/B interleaved: samples/s ratio, time to first step; the demo's time to the first step in the cpu image and under ftjob run, each against no bytecode
	$(PY) benchmarks/runtime_overhead.py $(BENCH_QUICK) --json $(BENCH_OUT)/runtime-overhead.json

bench-data: setup ## MeCab tokenisation throughput; the runtime's tokenised-dataset cache, first run vs second
	$(PY) benchmarks/data_prep.py $(BENCH_QUICK) --json $(BENCH_OUT)/data-prep.json

bench-compile-cache: setup ## Time to the first training step with the precompile trial on a cold vs a warm compile cache (ftjob run)
	$(PY) benchmarks/compile_cache.py $(BENCH_QUICK) --json $(BENCH_OUT)/compile-cache.json

bench-failover: setup k8s-bins ## Two elected operators: the standby's requests, and takeover times after a SIGKILL and a SIGTERM of the leader
	$(PY) benchmarks/leader_failover.py --json $(BENCH_OUT)/leader-failover.json

bench-gpu: setup ## BERT-base Japanese on one NVIDIA GPU, bf16, seq 128, across batch sizes: samples/s, MFU (GPU machines only)
	$(PY) benchmarks/gpu_bert_ja.py --json $(BENCH_OUT)/gpu-bert-ja.json

bench-xeon-stacks: setup ## xeon-amx stacks on the QA sample, 2 ranks: upstream (gloo) vs ipex (oneCCL) where installed, and all_reduce per process group
	$(PY) benchmarks/xeon_stacks.py $(if $(QUICK),--steps 24 --repeats 1 --collective-repeats 2,) --json $(BENCH_OUT)/xeon-stacks.json

peer-bin: ## Build the Kubeflow training-operator v1.8.1 from its Go module (tools/cluster/peer; cached per version)
	$(CLUSTER_TOOL) bin training-operator

bench-peer: setup k8s-bins peer-bin ## Raw vs the floor (the job, its children, one status patch) vs ours vs Kubeflow training-operator, interleaved on one control plane; table and goal line -> benchmarks/README.md
	$(PY) benchmarks/operator_scale.py --peer --jobs $(BENCH_PEER_JOBS) --rounds $(BENCH_PEER_ROUNDS) \
		--json $(BENCH_OUT)/operator-peer.json --readme benchmarks/README.md
