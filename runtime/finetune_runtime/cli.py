"""Command line: `ftjob-runtime <command>` / `python -m finetune_runtime <command>` (docs/architecture.md)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from finetune_runtime.backends import MissingStackError


def _exec(argv: list[str], extra_env: dict[str, str] | None = None) -> int:
    """Replace this process: signals from the kubelet reach torchrun/mpirun/sshd directly."""
    env = {**os.environ, **(extra_env or {})}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(argv[0], argv, env)


def _run_relaying(argv: list[str], extra_env: dict[str, str]) -> int:
    """A precompile trial: the launcher stays the parent, to relay the trial's cache report (relay.py)."""
    from finetune_runtime.relay import run_relaying

    return run_relaying(argv, extra_env)


def cmd_worker(_: argparse.Namespace) -> int:
    from finetune_runtime.train import run_worker

    return run_worker()


def cmd_launch(ns: argparse.Namespace) -> int:
    from finetune_runtime.launcher import launch_plan
    from finetune_runtime.startup import mark_start

    mark_start()  # the pod's main process: the time to the first step counts from its start
    argv, extra = launch_plan(os.environ, ns.precompile)
    print("ftjob-runtime launch: " + " ".join(argv), flush=True)
    return _run_relaying(argv, extra) if ns.precompile else _exec(argv, extra)


def cmd_mpirun(ns: argparse.Namespace) -> int:
    from finetune_runtime.launcher import mpirun_plan, parse_hostfile, write_ssh_config, write_ssh_wrapper
    from finetune_runtime.sshd import DEFAULT_SECRET_DIR, LAUNCHER_KEYS, install_keys, runtime_ssh_dir
    from finetune_runtime.startup import mark_start

    mark_start()  # the launcher pod's main process: rank 0's time to the first step counts from its start
    ssh_dir = runtime_ssh_dir(os.environ)
    secret = Path(os.environ.get("FTJOB_SSH_SECRET_DIR") or DEFAULT_SECRET_DIR)
    if secret.is_dir():
        install_keys(secret, ssh_dir, required=LAUNCHER_KEYS)
    hostfile = os.environ.get("FTJOB_HOSTFILE", "")
    hosts = [h.host for h in parse_hostfile(Path(hostfile).read_text())] if hostfile else []
    wrapper = write_ssh_wrapper(write_ssh_config(os.environ, hosts, ssh_dir))
    program = ns.program[1:] if ns.program[:1] == ["--"] else ns.program
    argv, extra = mpirun_plan(os.environ, ssh_exec=str(wrapper), program=program or None)
    print("ftjob-runtime mpirun: " + " ".join(argv), flush=True)
    for k, v in sorted(extra.items()):
        print(f"ftjob-runtime mpirun: {k}={v}", flush=True)
    precompile = os.environ.get("FTJOB_MODE") == "precompile"
    return _run_relaying(argv, extra) if precompile else _exec(argv, extra)


def cmd_sshd(_: argparse.Namespace) -> int:
    from finetune_runtime.sshd import prepare_sshd

    argv = prepare_sshd(os.environ)
    print("ftjob-runtime sshd: " + " ".join(argv), flush=True)
    return _exec(argv)


def cmd_wait_for(ns: argparse.Namespace) -> int:
    from finetune_runtime.waitfor import Probe, split_host_port, wait_for

    ssh_port = int(os.environ.get("FTJOB_SSH_PORT") or 0)  # the workers' sshd (the operator sets it)
    if not ssh_port and any(":" not in h for h in ns.ssh):
        print("wait-for: --ssh HOST needs HOST:PORT, or FTJOB_SSH_PORT set", file=sys.stderr)
        return 2
    probes = [Probe("dns", h) for h in ns.dns]
    probes += [Probe("ssh", *split_host_port(h, ssh_port)) for h in ns.ssh]
    probes += [Probe("tcp", *split_host_port(h, 0)) for h in ns.tcp]
    if not probes:
        print("wait-for: nothing to wait for (give --dns, --ssh or --tcp)", file=sys.stderr)
        return 2
    return 0 if wait_for(probes, ns.timeout, log=lambda m: print(m, flush=True)) else 1


def cmd_selfcheck(_: argparse.Namespace) -> int:
    from finetune_runtime.selfcheck import run_selfcheck

    ok, report = run_selfcheck()
    print(json.dumps(report, indent=2, ensure_ascii=False))
    return 0 if ok else 1


def cmd_build_vocab(ns: argparse.Namespace) -> int:
    from finetune_runtime.vocab import BPE_SPECIAL_TOKENS, build_bpe, build_vocab, texts_from_files, write_vocab

    files = [Path(f) for f in ns.input]
    texts = list(texts_from_files(files, ns.field))
    out = Path(ns.output)
    ids: dict[str, int] = {}
    if ns.kind == "bpe":
        tok = build_bpe(texts, ns.vocab_size)
        target = out / "tokenizer.json"
        tok.save(str(target))
        size = tok.get_vocab_size()
        ids = {
            "pad_token_id": tok.token_to_id("<pad>"),
            "bos_token_id": tok.token_to_id("<s>"),
            "eos_token_id": tok.token_to_id("<|end|>"),
        }
        assert list(ids.values()) == [BPE_SPECIAL_TOKENS.index(t) for t in ("<pad>", "<s>", "<|end|>")]
    else:
        tokens = build_vocab(texts, ns.lang, ns.vocab_size)
        target = out / "vocab.txt"
        write_vocab(tokens, target)
        size = len(tokens)
    cfg = out / "config.json"
    if cfg.exists():
        # Keep the model's embedding table exactly as large as the vocabulary it was built for.
        doc = json.loads(cfg.read_text(encoding="utf-8"))
        doc.update({"vocab_size": size, **ids})
        cfg.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {size} tokens to {target}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ftjob-runtime", description="finetune-operator in-pod runtime")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("worker", help="one training process (under torchrun or mpirun)").set_defaults(fn=cmd_worker)
    lp = sub.add_parser("launch", help="torchrun rank pods: exec torchrun from the FTJOB_* env")
    lp.add_argument("--precompile", action="store_true", help="trial run that fills the compile cache")
    lp.set_defaults(fn=cmd_launch)
    mp = sub.add_parser("mpirun", help="MPI launcher pod: ssh config + exec mpirun")
    mp.add_argument(
        "program",
        nargs=argparse.REMAINDER,
        help="after `--`: the job's own command for every rank (default: the built-in worker)",
    )
    mp.set_defaults(fn=cmd_mpirun)
    sub.add_parser("sshd", help="MPI worker pods: install keys, run sshd").set_defaults(fn=cmd_sshd)
    wp = sub.add_parser("wait-for", help="wait for DNS names / SSH / TCP endpoints, with a deadline")
    # Repeatable and cumulative: the launcher passes `--dns w0 --ssh w0 --dns w1 --ssh w1`, and with plain
    # nargs the last --dns/--ssh replaced the earlier ones, so it waited for the last worker only.
    wp.add_argument("--dns", action="extend", nargs="+", default=[], metavar="HOST")
    wp.add_argument("--ssh", action="extend", nargs="+", default=[], metavar="HOST[:PORT]")
    wp.add_argument("--tcp", action="extend", nargs="+", default=[], metavar="HOST:PORT")
    wp.add_argument("--timeout", type=float, default=600.0, help="seconds (default 600)")
    wp.set_defaults(fn=cmd_wait_for)
    sub.add_parser("selfcheck", help="image smoke test").set_defaults(fn=cmd_selfcheck)
    bp = sub.add_parser("build-vocab", help="train a tokenizer on sample text (WordPiece vocab.txt or BPE)")
    bp.add_argument("--lang", choices=["ja", "en"], required=True)
    bp.add_argument(
        "--kind",
        choices=["wordpiece", "bpe"],
        default="wordpiece",
        help="wordpiece: vocab.txt for BERT tokenizers; bpe: byte-level tokenizer.json (decoders)",
    )
    bp.add_argument("--input", nargs="+", required=True, help="jsonl or SQuAD json files")
    bp.add_argument(
        "--field",
        nargs="*",
        default=["review_body", "text"],
        help="jsonl text fields (a list of chat messages contributes each content)",
    )
    bp.add_argument("--vocab-size", type=int, default=4000)
    bp.add_argument(
        "--output",
        required=True,
        help="model directory (vocab.txt or tokenizer.json; config.json vocab_size, token ids)",
    )
    bp.set_defaults(fn=cmd_build_vocab)
    return p


def main(argv: list[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    try:
        return int(ns.fn(ns))
    except MissingStackError as e:
        print(f"ftjob-runtime: {e}", file=sys.stderr)
        return 3
