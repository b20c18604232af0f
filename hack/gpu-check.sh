#!/usr/bin/env bash
# The runtime's nvidia path for real, on a machine with an NVIDIA GPU, torch and transformers: `ftjob run` of the
# QA sample (tiny DistilBERT, SQuAD-format) and the causal-lm LoRA sample (tiny Llama) with
# hardware.profile nvidia, one process per GPU (torchrun, NCCL), bf16. Nothing is fetched: missing Python
# packages (datasets and its dill/multiprocess, say) come as wheels in WHEELS=dir. The ja sample is left out: MeCab's
# dictionary is 249 MB. Results and logs go to OUT (default _out/gpu-check); exit status 0 only if both ran.
#   PROFILE=cpu PRECISION=fp32 hack/gpu-check.sh     # the same script on CPU (how it is tested without a GPU)
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${OUT:-_out/gpu-check}")
profile=${PROFILE:-nvidia}
precision=${PRECISION:-bf16}
py=${PYTHON:-python3}
mkdir -p "$out"
site=$(mktemp -d)
bin=$(mktemp -d)
trap 'rm -rf "$site" "$bin"' EXIT
if [ -n "${WHEELS:-}" ]; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$WHEELS"/*.whl
fi
# ftjob run starts the runtime as `ftjob-runtime` (the images' entry point); here it runs from the source tree.
py_path=$(command -v "$py")
case $py_path in /*) ;; *) py_path=$PWD/$py_path ;; esac  # a virtual environment's python, not its target
printf '#!/bin/sh\nexec %s -m finetune_runtime "$@"\n' "$py_path" >"$bin/ftjob-runtime"
chmod +x "$bin/ftjob-runtime"
export PATH="$bin:$PATH" PYTHONPATH="$site:$PWD/operator:$PWD/runtime${PYTHONPATH:+:$PYTHONPATH}"
"$py" - <<PY | tee "$out/versions.txt"
import torch, transformers, datasets
print("torch", torch.__version__, "cuda", torch.version.cuda, "device",
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
print("transformers", transformers.__version__, "datasets", datasets.__version__)
PY
rc=0
for sample in squad-mini-mpi instruct-mini-lora; do
  job="$out/$sample.yaml"
  "$py" - "$sample" "$job" "$profile" "$precision" <<'PY'
import sys, yaml
sample, job, profile, precision = sys.argv[1:]
d = yaml.safe_load(open(f"examples/jobs/{sample}.yaml"))
d["metadata"]["name"] += f"-{profile}"
d["spec"]["hardware"] = {"profile": profile, "nodes": 1, "procsPerNode": 1}
d["spec"].pop("launcher", None)  # the profile's own launcher: torchrun for nvidia and cpu
d["spec"].pop("mpi", None)
d["spec"].setdefault("training", {})["precision"] = precision
yaml.safe_dump(d, open(job, "w"), sort_keys=False)
PY
  start=$(date +%s)
  if "$py" -m finetune_operator.cli run -q -f "$job" --workdir "$out/$sample" >"$out/$sample.log" 2>&1; then
    echo "$sample: ok in $(( $(date +%s) - start )) s"
  else
    rc=1; echo "$sample: FAILED (last lines of $out/$sample.log):"; tail -30 "$out/$sample.log"
  fi
  grep -h -o "training on .*" "$out/$sample"/logs/train-node0.log || true
  "$py" -c 'import json,sys; m=json.load(open(sys.argv[1])); print({k: m.get(k) for k in ("backend", "globalStep", "train", "eval")})' \
    "$out/$sample"/output/*/metrics.json 2>/dev/null || true
done
exit $rc
