"""Command line: `python -m ftjob_cluster bin NAME | build | up | down | status` (see docs/cluster.md)."""

from __future__ import annotations

import argparse
import sys

from ftjob_cluster import bins


def _cmd_bin(args: argparse.Namespace) -> int:
    for name in args.names:
        print(bins.ensure_binary(name))
    return 0


def _cmd_build(args: argparse.Namespace) -> int:
    bins.fetch_client_binaries(force=args.force)
    result = bins.build_go_binaries(force=args.force)
    if result is not None:
        print(f"go build took {result.seconds:.0f} s")
    for name in bins.tool_names():
        print(bins.ensure_binary(name))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ftjob-cluster", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("bin", help="print the absolute path of pinned binaries, fetching/building them first")
    p.add_argument("names", nargs="+", choices=bins.tool_names(), metavar="NAME")
    p.set_defaults(func=_cmd_bin)
    p = sub.add_parser("build", help="fetch kubectl/helm and build etcd + control plane into the cache")
    p.add_argument("--force", action="store_true", help="rebuild even if the cache is current")
    p.set_defaults(func=_cmd_build)
    try:
        from ftjob_cluster import cli_cluster  # needs `cryptography`; absent on a bare python3
    except ImportError:
        cli_cluster = None  # type: ignore[assignment]
    if cli_cluster is not None:
        cli_cluster.add_commands(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
