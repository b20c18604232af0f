"""`ftjob`: render a job's children offline, print the CRD, run the operator, or run a job locally."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from . import constants
from .admission import validate
from .api.validation import InvalidSpec
from .policy import check_config, violations


class _NoAliasDumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    # Multi-line values (config.json, hostfile) read as they are in the pod, not as escaped strings.
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_NoAliasDumper.add_representer(str, _str)


def dump_yaml_stream(objs: list[dict[str, Any]]) -> str:
    return yaml.dump_all(objs, Dumper=_NoAliasDumper, sort_keys=False, width=120)


class _KeyError(ValueError):
    pass


def _string_keys(value: Any, path: str) -> Any:
    """Map keys as kubectl turns YAML into JSON (sigs.k8s.io/yaml): an unquoted number or boolean key (a labelMap's
    `1: 0`) becomes its text; any other non-string key has no JSON form."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if isinstance(k, bool):
                key = "true" if k else "false"
            elif isinstance(k, int):
                key = str(k)
            elif isinstance(k, str):
                key = k
            else:
                raise _KeyError(f"{path or 'the document'} has the key {k!r}, which JSON cannot hold: quote it")
            out[key] = _string_keys(v, f"{path}.{key}" if path else key)
        return out
    if isinstance(value, list):
        return [_string_keys(v, f"{path}[{i}]") for i, v in enumerate(value)]
    return value


def load_jobs(path: str) -> list[dict[str, Any]]:
    text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    try:
        docs = [_string_keys(d, "") for d in yaml.safe_load_all(text) if d]
    except yaml.YAMLError as e:
        raise SystemExit(f"error: {path} is not valid YAML: {e}") from None
    except _KeyError as e:
        raise SystemExit(f"error: {path}: {e}") from None
    if not docs:
        raise SystemExit(f"error: {path} holds no FineTuneJob")
    for d in docs:
        if not isinstance(d, dict):
            raise SystemExit(f"error: {path}: every document must be a FineTuneJob mapping")
    return docs


def _print_invalid(name: object, error: InvalidSpec) -> None:
    print(f"error: FineTuneJob {name!r} is invalid:", file=sys.stderr)
    for err in error.errors:
        print(f"  {err}", file=sys.stderr)


def _one_valid_job(filename: str, command: str) -> dict[str, Any] | None:
    """The one FineTuneJob of a file, validated; None after printing why it is invalid."""
    jobs = load_jobs(filename)
    if len(jobs) != 1:
        raise SystemExit(f"error: ftjob {command} takes exactly one FineTuneJob")
    try:
        return validate(jobs[0])
    except InvalidSpec as e:
        meta = jobs[0].get("metadata")
        _print_invalid(meta.get("name") if isinstance(meta, dict) else None, e)
        return None


def load_config(path: str | None) -> dict[str, Any]:
    """Operator configuration (the chart's ConfigMap): `images: {registry, tag, digests}` (the profiles' default
    images, builders/images.py), `networkPolicy: {enabled: bool, extraIngress: [NetworkPolicyIngressRule]}`,
    `policy: {allowedImages, allowedServiceAccounts, allowedSecrets, ...}` (policy.py, docs/operator.md)."""
    from .builders.images import check_images_config

    if not path:
        return {}
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise SystemExit(f"error: {path}: expected a mapping with an `images` key")
    problems = check_images_config(data) + check_config(data)
    if problems:
        raise SystemExit(f"error: {path}: " + "; ".join(problems))
    return data


def _render(args: argparse.Namespace) -> int:
    from .builders import desired
    from .builders.layout import launcher_of
    from .sshkeys import generate_keys

    config = load_config(args.config)
    out: list[dict[str, Any]] = []
    failed = False
    for raw in load_jobs(args.filename):
        meta = raw.setdefault("metadata", {})
        name = meta.get("name", "<unnamed>") if isinstance(meta, dict) else "<unnamed>"
        given = meta.get("namespace") if isinstance(meta, dict) else None
        if args.namespace and given and given != args.namespace:
            # What kubectl says to `kubectl apply -n other -f job.yaml`; the API server refuses it too.
            failed = True
            print(
                f"error: FineTuneJob {name!r} names namespace {given!r} in metadata.namespace but is rendered into "
                f"{args.namespace!r} (-n): drop one of them",
                file=sys.stderr,
            )
            continue
        if args.namespace and isinstance(meta, dict):
            meta["namespace"] = args.namespace
        try:
            job = validate(raw)
        except InvalidSpec as e:
            failed = True
            _print_invalid(name, e)
            continue
        broken = violations(job["spec"], config, job["metadata"].get("namespace") or "default")
        if broken:
            failed = True
            print(
                f"error: FineTuneJob {name!r} breaks the operator's policy (the operator would fail it):",
                file=sys.stderr,
            )
            for msg in broken:
                print(f"  {msg}", file=sys.stderr)
            continue
        keys = generate_keys(name) if launcher_of(job["spec"]) == "mpi" else None
        out += desired(
            job, images=config.get("images"), ssh_keys=keys, network_policy_config=config.get("networkPolicy")
        ).all()
    if out:
        sys.stdout.write(dump_yaml_stream(out))
    return 1 if failed else 0


def _crd(_: argparse.Namespace) -> int:
    from .crd import crd_yaml

    sys.stdout.write(crd_yaml())
    return 0


def _admission_policy(_: argparse.Namespace) -> int:
    from .crd import admission_policy_yaml

    sys.stdout.write(admission_policy_yaml())
    return 0


def _api_docs(_: argparse.Namespace) -> int:
    from .apidoc import render

    sys.stdout.write(render())
    return 0


def duration(text: str) -> float:
    """Seconds from `15s`, `500ms`, `1m` or a bare number of seconds (the --leader-elect-* flags, spelled as
    kube-controller-manager's)."""
    units = (("ms", 0.001), ("s", 1.0), ("m", 60.0))
    number, scale = text.strip(), 1.0
    for suffix, factor in units:
        if number.endswith(suffix) and not (suffix == "s" and number.endswith("ms")):
            number, scale = number[: -len(suffix)], factor
            break
    try:
        value = float(number) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (e.g. 15s, 500ms, 1m)") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration must be positive")
    return value


def _operator(args: argparse.Namespace) -> int:
    from .handlers import run_operator
    from .leader import Settings, Timing, default_identity, default_namespace

    election = None
    if args.leader_elect:
        namespace = args.leader_elect_resource_namespace or default_namespace()
        if not namespace:
            print(
                "error: --leader-elect needs the Lease's namespace: pass --leader-elect-resource-namespace, or set "
                "POD_NAMESPACE (the chart sets it from the pod's own namespace)",
                file=sys.stderr,
            )
            return 2
        try:
            timing = Timing(
                args.leader_elect_lease_duration, args.leader_elect_renew_deadline, args.leader_elect_retry_period
            )
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        election = Settings(namespace, args.leader_elect_resource_name, default_identity(), timing)
    return run_operator(
        namespaces=args.namespace or [],
        config=load_config(args.config),
        metrics_port=args.metrics_port,
        health_port=args.health_port,
        verbose=args.verbose,
        election=election,
    )


def _run(args: argparse.Namespace) -> int:
    from .local import run_local

    job = _one_valid_job(args.filename, "run")
    if job is None:
        return 1
    return run_local(
        job,
        workdir=Path(args.workdir),
        max_procs=args.max_procs,
        max_nodes=args.max_nodes,
        output=Path(args.output) if args.output else None,
        precision=args.precision,
        quiet=args.quiet,
    )


def _estimate(args: argparse.Namespace) -> int:
    import json

    from .estimate import Calibration, estimate, leave_one_out, load_prices, loo_markdown, render_text, to_json
    from .estimate.runs import RUN_ORIGIN, load_calibration

    jobs: list[dict[str, Any]] = []
    if args.calibration_from_cluster:
        from kubernetes.client.exceptions import ApiException
        from kubernetes.config.config_exception import ConfigException

        from .k8s import Kube, load_client_config

        where = f"namespace {args.calibration_namespace}" if args.calibration_namespace else "all namespaces"
        try:
            load_client_config()
            jobs = Kube().list_jobs(args.calibration_namespace)
        except (ConfigException, ApiException, OSError) as e:
            print(f"error: --calibration-from-cluster: cannot list the FineTuneJobs of {where}: {e}", file=sys.stderr)
            print(
                "  (list permission on finetunejobs is needed; or save them and pass the file: "
                "kubectl get ftj -n NS -o yaml > runs.yaml; ftjob estimate --calibration runs.yaml)",
                file=sys.stderr,
            )
            return 1
    try:
        records, skipped = load_calibration(args.calibration or [], jobs)
        cal = Calibration(records)
        prices = load_prices(args.prices)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    runs = [r for r in records if r.origin.startswith(RUN_ORIGIN)]
    if runs or skipped or args.calibration_from_cluster:
        print(f"calibration: {len(runs)} measured run(s) of FineTuneJobs", file=sys.stderr)
        for why in skipped:
            print(f"  no record from {why}", file=sys.stderr)
    if args.leave_one_out:
        sys.stdout.write(loo_markdown(leave_one_out(cal)))
        return 0
    if not args.filename:
        print("error: ftjob estimate needs -f job.yaml (or --leave-one-out)", file=sys.stderr)
        return 2
    job = _one_valid_job(args.filename, "estimate")
    if job is None:
        return 1
    model_config = None
    if args.model_config:
        try:
            model_config = json.loads(Path(args.model_config).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            print(f"error: --model-config {args.model_config}: {e}", file=sys.stderr)
            return 1
    try:
        est = estimate(
            job,
            cal,
            prices,
            model_config=model_config,
            tokens=args.tokens_per_sample,
            samples=args.samples,
            others=not args.as_written,
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.json:
        sys.stdout.write(json.dumps(to_json(est), indent=2) + "\n")
    else:
        sys.stdout.write(render_text(est))
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ftjob", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("render", help="print every object the operator would create for a job (no cluster)")
    r.add_argument("-f", "--filename", required=True, help="FineTuneJob YAML ('-' for stdin)")
    r.add_argument("-n", "--namespace", help="namespace to render into (default: the job's, else default)")
    r.add_argument(
        "--config", help="operator configuration file (images: registry, tag and digests, networkPolicy, policy)"
    )
    r.set_defaults(func=_render)

    c = sub.add_parser("crd", help="print the CustomResourceDefinition")
    c.set_defaults(func=_crd)

    v = sub.add_parser(
        "admission-policy", help="print the ValidatingAdmissionPolicy (and binding) for rules a CRD cannot state"
    )
    v.set_defaults(func=_admission_policy)

    d = sub.add_parser("api-docs", help="print the API reference (docs/api.md) in Markdown")
    d.set_defaults(func=_api_docs)

    o = sub.add_parser("operator", help="run the operator (kopf) against the current kubeconfig")
    o.add_argument("--namespace", action="append", help="watch only this namespace (repeatable)")
    o.add_argument(
        "--config", help="operator configuration file (images: registry, tag and digests, networkPolicy, policy)"
    )
    o.add_argument("--metrics-port", type=int, default=8080, help="Prometheus /metrics port (0: off)")
    o.add_argument("--health-port", type=int, default=8081, help="/healthz port (0: off)")
    o.add_argument("-v", "--verbose", action="store_true")
    le = o.add_argument_group(
        "leader election",
        "several replicas, one acting: a coordination.k8s.io/v1 Lease as controller-runtime uses it "
        "(docs/operator.md, 'High availability'); off unless --leader-elect, which the chart passes",
    )
    le.add_argument("--leader-elect", action="store_true", help="act only while holding the Lease")
    le.add_argument(
        "--leader-elect-lease-duration",
        type=duration,
        default=constants.LEASE_DURATION_S,
        help="a standby takes over once the lease went this long without renewal (whole seconds; default 15s)",
    )
    le.add_argument(
        "--leader-elect-renew-deadline",
        type=duration,
        default=constants.RENEW_DEADLINE_S,
        help="a leader that has not renewed for this long stops acting and exits (default 10s)",
    )
    le.add_argument(
        "--leader-elect-retry-period",
        type=duration,
        default=constants.RETRY_PERIOD_S,
        help="between renewals, and between a standby's attempts, with up to 1.2x jitter (default 2s)",
    )
    le.add_argument("--leader-elect-resource-name", default=constants.LEASE_NAME, help="the Lease's name")
    le.add_argument(
        "--leader-elect-resource-namespace",
        help="the Lease's namespace (default: POD_NAMESPACE, else the pod's service-account namespace)",
    )
    o.set_defaults(func=_operator)

    u = sub.add_parser("run", help="run a job on this machine with torchrun or mpirun, as the pods would")
    u.add_argument("-f", "--filename", required=True)
    u.add_argument("--workdir", default="_out/run", help="holds output/ and cache/ (default: _out/run)")
    u.add_argument("--output", help="output directory (default: WORKDIR/output/<output.path>)")
    u.add_argument("--max-procs", type=int, default=None, help="cap processes per node")
    u.add_argument("--max-nodes", type=int, default=None, help="cap nodes (each node is a local process group)")
    u.add_argument("--precision", choices=["fp32", "bf16"], help="override training.precision")
    u.add_argument("-q", "--quiet", action="store_true", help="no progress bar, only the summary")
    u.set_defaults(func=_run)

    e = sub.add_parser(
        "estimate",
        help="predict samples/s, time and cost of a job on its hardware and on every other profile's (no cluster)",
        description="Predicted samples/s, time to finish and on-demand cost of a job, as written and on one node "
        "of every instance type of every profile, from a FLOPs model calibrated on measured runs "
        "(docs/estimate.md). The job must pass the same validation as `ftjob render`.",
    )
    e.add_argument("-f", "--filename", help="FineTuneJob YAML ('-' for stdin)")
    e.add_argument("--json", action="store_true", help="the same as data")
    e.add_argument(
        "--calibration",
        action="append",
        metavar="FILE",
        help="more calibration records (YAML or JSON; repeatable; '-' for stdin): a record replaces a shipped one of "
        "the same id. FineTuneJobs (`kubectl get ftj -o yaml`) give a record per Succeeded job with measured "
        "throughput",
    )
    e.add_argument(
        "--calibration-from-cluster",
        action="store_true",
        help="add a record for each Succeeded FineTuneJob of the cluster (its spec and status.throughput; the "
        "current kubeconfig; all namespaces unless --calibration-namespace)",
    )
    e.add_argument("--calibration-namespace", metavar="NS", help="with --calibration-from-cluster: only this one")
    e.add_argument("--prices", metavar="FILE", help="a price table to use instead of the shipped one")
    e.add_argument("--model-config", metavar="FILE", help="the model's config.json (for a model not known here)")
    e.add_argument(
        "--tokens-per-sample", type=float, metavar="N", help="mean padded length, where batches pad to their longest"
    )
    e.add_argument("--samples", type=int, metavar="N", help="training samples per epoch (when not known here)")
    e.add_argument("--as-written", action="store_true", help="only the job's own hardware")
    e.add_argument(
        "--leave-one-out",
        action="store_true",
        help="print the check of docs/estimate.md: each acceptance figure predicted from every other record",
    )
    e.set_defaults(func=_estimate)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rc: int = args.func(args)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
