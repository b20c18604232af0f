# Helm chart, kustomize manifests and the EKS guide (charts/finetune-operator, manifests/, docs/eks.md).
CHART_DIR := charts/finetune-operator
# The chart's copies are read by its templates (templates/crd.yaml, templates/admission-policy.yaml), not put in
# crds/, so `helm upgrade` updates them (charts/finetune-operator/README.md, "Upgrade").
CRD_COPIES := $(CHART_DIR)/crd/finetunejobs.yaml manifests/crd/finetunejobs.yaml
POLICY_COPIES := $(CHART_DIR)/admission/finetunejobs-policy.yaml manifests/crd/finetunejobs-policy.yaml

.PHONY: generate generate-estimate-doc generate-crds generate-version generate-api-docs test-chart test-chart-install chart-lint

# Other areas may add their own generators as prerequisites of `generate`.
generate: generate-crds generate-version generate-api-docs ## Regenerate every generated file

generate-api-docs: setup ## Write docs/api.md from the schema and rules (`ftjob api-docs`)
	$(VENV)/bin/ftjob api-docs > docs/api.md.new && mv docs/api.md.new docs/api.md

generate-crds: setup ## Copy `ftjob crd` and `ftjob admission-policy` into the chart and manifests/crd/
	@mkdir -p $(dir $(CRD_COPIES)) $(dir $(POLICY_COPIES))
	$(VENV)/bin/ftjob crd > $(CHART_DIR)/crd/.finetunejobs.yaml.new
	@for f in $(CRD_COPIES); do cp $(CHART_DIR)/crd/.finetunejobs.yaml.new $$f; done
	@rm -f $(CHART_DIR)/crd/.finetunejobs.yaml.new
	$(VENV)/bin/ftjob admission-policy > $(CHART_DIR)/admission/.policy.yaml.new
	@for f in $(POLICY_COPIES); do cp $(CHART_DIR)/admission/.policy.yaml.new $$f; done
	@rm -f $(CHART_DIR)/admission/.policy.yaml.new

generate-version: ## Write VERSION into the chart's Chart.yaml and the kustomize manifests (hack/version.py)
	python3 hack/version.py

chart-lint: ## helm lint --strict the chart (pinned helm)
	"$$(tools/cluster/bin/ftjob-tool helm)" lint --strict $(CHART_DIR)

test-chart: setup ## Chart tier: lint, render assertions, values schema, OpenAPI validation, kustomize parity, CRD drift, EKS guide files
	$(PY) -m pytest -q -m "not controlplane" tests/chart

# Needs the control-plane binaries (k8s-bins, mk/cluster.mk): helm install into a real apiserver, then the
# operator reconciling samples with the chart's RBAC, config and args.
test-chart-install: setup k8s-bins ## Chart tier on a real control plane: helm install, PSS admission, operator with the chart's RBAC
	$(PY) -m pytest -q -m controlplane tests/chart

TEST_TIERS += test-chart test-chart-install

# docs/estimate.md's tables come from the profiles' peaks, the calibration records and the prices
# (operator/finetune_operator/estimate); tests/unit fails while the document is stale.
generate: generate-estimate-doc
generate-estimate-doc: setup ## Write docs/estimate.md's predicted-vs-measured table and example from the estimate data
	$(PY) hack/estimate_doc.py
