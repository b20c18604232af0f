"""An OCI registry for the local cluster: CNCF distribution (`registry serve`, built from its Go module by
bins: tools/cluster/registry) on loopback, with TLS from the cluster's CA and htpasswd (bcrypt) auth.

`Registry(directory, ca_dir).start()`:
1. issues a serving certificate for its address (127.0.0.1 and localhost unless `address` names another of this
   machine's addresses, such as the e2e nodes' NODE_IP) from the CA in `ca_dir` (a LocalCluster's pki/: the CA
   the cluster's clients already trust), written there as registry-serving.{crt,key};
2. writes an htpasswd file with one bcrypt entry (user `ftjob`, a random password unless one is given) and a
   registry configuration: filesystem storage under `storage` (default `directory`/storage), TLS, htpasswd auth,
   deletes enabled; with `collect_garbage`, runs `registry garbage-collect --delete-untagged` on that storage
   first (a storage kept across sessions drops the builds whose tags were pushed over);
3. starts `registry serve` on `address`:`port` (a free loopback port by default) and waits until `/v2/` answers
   401 (up, and refusing anonymous clients).

The pure functions below give what clients need to trust and log in to it: a Docker config.json `auths` entry,
an image pull Secret (kubernetes.io/dockerconfigjson) for pods, and containerd's registry configuration (a
`certs.d/<host>/hosts.toml`, and the CRI plugin's config_path that points at it) for a node. docs/cluster.md "Registry".
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ftjob_cluster import bins, pki
from ftjob_cluster.localcluster import _die_with_parent, _tail, _terminate_group, free_port

DEFAULT_USER = "ftjob"
REALM = "ftjob-registry"
# bcrypt's cost factor for the htpasswd entry. The registry checks the password with bcrypt on every request a
# client makes (a push is dozens), so the minimum (4) keeps that cheap; the entry guards a throwaway registry
# on loopback whose password is random per start.
BCRYPT_ROUNDS = 4
# containerd 1.6's CRI plugin (config version 2), the node's containerd (ftjob_cluster.node).
CRI_PLUGIN = "io.containerd.grpc.v1.cri"


def htpasswd_entry(user: str, password: str, rounds: int = BCRYPT_ROUNDS) -> str:
    """One htpasswd line with a bcrypt hash: the only scheme distribution's htpasswd auth accepts."""
    import bcrypt  # test tooling only: `bin`/`build` on a bare python3 never import this module

    if ":" in user:
        raise ValueError(f"htpasswd user names cannot contain ':': {user!r}")
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=rounds)).decode()
    return f"{user}:{hashed}\n"


def registry_config(
    address: str, storage: Path, cert: Path, key: Path, htpasswd: Path, http_secret: str
) -> dict[str, Any]:
    """distribution's configuration (config.yml; JSON is YAML) for a registry serving TLS with htpasswd auth."""
    return {
        "version": 0.1,
        "log": {"level": "info", "formatter": "text", "fields": {"service": "registry"}},
        "storage": {
            "filesystem": {"rootdirectory": str(storage)},
            "delete": {"enabled": True},
            # Upload purging walks the storage hourly; a test registry lives for minutes.
            "maintenance": {"uploadpurging": {"enabled": False}},
        },
        "http": {
            "addr": address,
            # Set, so every start does not log that it generated one.
            "secret": http_secret,
            "tls": {"certificate": str(cert), "key": str(key)},
            "headers": {"X-Content-Type-Options": ["nosniff"]},
        },
        "auth": {"htpasswd": {"realm": REALM, "path": str(htpasswd)}},
    }


def serving_names(address: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The DNS names and IP addresses of the registry's serving certificate: the address it listens on (what
    clients name it by), and localhost with 127.0.0.1 when that is loopback."""
    if address == "127.0.0.1":
        return ("localhost",), ("127.0.0.1",)
    return (), (address,)


def basic_auth(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


def docker_config(host: str, user: str, password: str) -> dict[str, Any]:
    """A Docker config.json that logs in to `host` (what `docker login` writes, and what an image pull Secret
    holds)."""
    return {"auths": {host: {"username": user, "password": password, "auth": basic_auth(user, password)}}}


def image_pull_secret(name: str, namespace: str, host: str, user: str, password: str) -> dict[str, Any]:
    """A kubernetes.io/dockerconfigjson Secret for pods' imagePullSecrets."""
    config = json.dumps(docker_config(host, user, password), separators=(",", ":"))
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64.b64encode(config.encode()).decode()},
    }


def _toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def containerd_hosts_toml(host: str, ca_file: Path | str) -> str:
    """containerd's `<config_path>/<host>/hosts.toml` for the registry at `host` ("127.0.0.1:PORT"): pull from
    it over HTTPS, trusting the cluster CA in `ca_file`. The directory name is the host with its port."""
    url = _toml_string(f"https://{host}")
    return (
        f'server = {url}\n\n[host.{url}]\n  capabilities = ["pull", "resolve"]\n  ca = {_toml_string(str(ca_file))}\n'
    )


def containerd_cri_registry_config(config_path: Path | str) -> str:
    """The CRI plugin's registry table in containerd's config.toml (version 2, containerd 1.6): look up registry
    hosts in `config_path` (one `<host>/hosts.toml` each, containerd_hosts_toml's), read at every pull. No
    credentials: a node that logged in by itself would pull for any pod, so pods authenticate with their
    imagePullSecrets. containerd 1.6 refuses `mirrors` and `configs.<host>.tls` beside config_path, hence the CA
    lives in hosts.toml."""
    return f'[plugins."{CRI_PLUGIN}".registry]\n  config_path = {_toml_string(str(config_path))}\n'


class RegistryError(RuntimeError):
    pass


class Registry:
    """One `registry serve` process; `host` ("127.0.0.1:PORT") is the name images are tagged with."""

    def __init__(
        self,
        directory: Path,
        ca_dir: Path,
        *,
        user: str = DEFAULT_USER,
        password: str | None = None,
        address: str = "127.0.0.1",
        port: int | None = None,
        storage: Path | None = None,
        collect_garbage: bool = False,
    ) -> None:
        self.directory = directory
        self.ca_dir = ca_dir
        self.user = user
        self.password = password or secrets.token_urlsafe(18)
        self.address = address
        self.port = port
        self.storage = storage or directory / "storage"
        self.collect_garbage = collect_garbage
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = directory / "registry.log"

    @property
    def host(self) -> str:
        if self.port is None:
            raise RegistryError("registry not started")
        return f"{self.address}:{self.port}"

    @property
    def ca_cert(self) -> Path:
        """The CA clients verify the registry with (the cluster's)."""
        return self.ca_dir / "ca.crt"

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_cert))

    def start(self, timeout: float = 60.0) -> Registry:
        binary = bins.ensure_binary("registry")
        self.directory.mkdir(parents=True, exist_ok=True)
        dns_names, ips = serving_names(self.address)
        serving = pki.CertificateAuthority.load(self.ca_dir).issue(
            "registry-serving", "ftjob-registry", dns_names=dns_names, ips=ips, server=True
        )
        htpasswd = self.directory / "htpasswd"
        htpasswd.write_text(htpasswd_entry(self.user, self.password))
        htpasswd.chmod(0o600)
        self.port = self.port or free_port()
        config = registry_config(
            self.host,
            self.storage,
            serving.cert,
            serving.key,
            htpasswd,
            secrets.token_hex(16),
        )
        config_path = self.directory / "config.yml"
        config_path.write_text(json.dumps(config, indent=2) + "\n")
        config_path.chmod(0o600)  # holds the HTTP secret
        # REGISTRY_* variables would override the file; distribution's tracing exports spans to an OTLP
        # collector on localhost:4318 unless told otherwise.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("REGISTRY_", "OTEL_"))}
        env["OTEL_TRACES_EXPORTER"] = "none"
        if self.collect_garbage and (self.storage / "docker").is_dir():
            gc = subprocess.run(
                [str(binary), "garbage-collect", "--delete-untagged", str(config_path)],
                capture_output=True,
                text=True,
                env=env,
            )
            if gc.returncode != 0:
                raise RegistryError(f"registry garbage-collect failed: {(gc.stderr or gc.stdout)[-2000:]}")
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [str(binary), "serve", str(config_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self._wait_ready(timeout)
        return self

    def status(self, path: str = "/v2/", *, authenticated: bool = False) -> int:
        """HTTP status of a GET on the registry, verifying its certificate against the cluster CA."""
        req = urllib.request.Request(f"https://{self.host}{path}")
        if authenticated:
            req.add_header("Authorization", f"Basic {basic_auth(self.user, self.password)}")
        try:
            with urllib.request.urlopen(req, timeout=5, context=self.ssl_context()) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: object = None
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RegistryError(
                    f"registry exited with {self.process.returncode}; log {self.log_path}:\n{self._tail()}"
                )
            try:
                last = self.status()
                if last == 401:  # serving, and asking for credentials
                    return
            except OSError as e:
                last = e
            if time.monotonic() > deadline:
                raise RegistryError(
                    f"registry not ready within {timeout:.0f} s ({last}); log {self.log_path}:\n{self._tail()}"
                )
            time.sleep(0.2)

    def _tail(self) -> str:
        return _tail(self.log_path, 30)

    def stop(self) -> None:
        if self.process is not None:
            _terminate_group(self.process.pid, 15.0, self.process)
            self.process = None

    def __enter__(self) -> Registry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
