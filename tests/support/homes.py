"""A stand-in for a user's home: files a test must leave byte for byte as they were (issue 14: `ftjob run`
rewrote ~/.ssh/config)."""

from __future__ import annotations

from pathlib import Path

SENTINELS = {
    ".ssh/config": "# the user's own ssh config\nHost bastion\n  HostName bastion.example.org\n  User me\n",
    ".ssh/known_hosts": "bastion.example.org ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOk6yYzIxMTY5MjQ5NzgwMDAwMDAwMDAw\n",
    ".ssh/id_ed25519": "-----BEGIN OPENSSH PRIVATE KEY-----\nnot a real key\n-----END OPENSSH PRIVATE KEY-----\n",
    ".bashrc": "export EDITOR=vi\n",
}


def _snapshot(home: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every path below home: (mode, content; None for directories)."""
    return {
        str(p.relative_to(home)): (p.lstat().st_mode, None if p.is_dir() else p.read_bytes())
        for p in sorted(home.rglob("*"))
    }


class SentinelHome:
    """home = SentinelHome(tmp_path / "home"); ... run with HOME=home.path ...; home.assert_unchanged()"""

    def __init__(self, path: Path) -> None:
        self.path = path
        for rel, text in SENTINELS.items():
            f = path / rel
            f.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            f.write_text(text)
            f.chmod(0o600)
        self.before = _snapshot(path)

    def assert_unchanged(self) -> None:
        after = _snapshot(self.path)
        new = sorted(set(after) - set(self.before))
        gone = sorted(set(self.before) - set(after))
        changed = sorted(k for k in set(after) & set(self.before) if after[k] != self.before[k])
        assert not (new or gone or changed), (
            f"HOME {self.path} was touched: new {new}, removed {gone}, changed {changed}"
        )
