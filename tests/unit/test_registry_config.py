"""The local registry's client-side configuration (tools/cluster/ftjob_cluster/registry.py): what containerd on a
node reads to trust and log in to it, the image pull Secret pods use, and its own configuration. The registry
itself is exercised by tests/registry with Docker and helm."""

from __future__ import annotations

import base64
import json
import tomllib
from pathlib import Path

import bcrypt
import kubernetes_validate
import pytest

from ftjob_cluster import bins, registry

HOST = "127.0.0.1:5443"
CA = Path("/tmp/cluster/pki/ca.crt")
CRI = "io.containerd.grpc.v1.cri"
# The shape of the node's containerd config (ftjob_cluster.node.Containerd): version 2, the CRI plugin's table
# and its sub-tables; the registry fragment is appended to it.
NODE_CONFIG = f"""\
version = 2
[plugins."{CRI}"]
  sandbox_image = "registry.k8s.io/pause:3.10"
  [plugins."{CRI}".containerd]
    snapshotter = "overlayfs"
  [plugins."{CRI}".cni]
    bin_dir = "/usr/lib/cni"
"""


def test_hosts_toml_pulls_from_the_registry_over_https_trusting_the_cluster_ca() -> None:
    hosts = tomllib.loads(registry.containerd_hosts_toml(HOST, CA))
    assert hosts == {
        "server": f"https://{HOST}",
        "host": {f"https://{HOST}": {"capabilities": ["pull", "resolve"], "ca": str(CA)}},
    }


def test_cri_fragment_points_at_the_hosts_directory_and_carries_no_credentials() -> None:
    fragment = registry.containerd_cri_registry_config('/run/ftjob "node"/certs.d')
    config = tomllib.loads(NODE_CONFIG + fragment)  # appended to the node's config, it still parses
    # Only config_path: no `configs` (credentials: pods bring their own), and containerd 1.6 refuses mirrors and
    # configs.<host>.tls beside config_path (pkg/cri/config/config.go).
    assert config["plugins"][CRI]["registry"] == {"config_path": '/run/ftjob "node"/certs.d'}
    assert config["plugins"][CRI]["sandbox_image"] == "registry.k8s.io/pause:3.10"


def test_the_serving_certificate_names_the_address_clients_use() -> None:
    assert registry.serving_names("127.0.0.1") == (("localhost",), ("127.0.0.1",))
    assert registry.serving_names("10.250.0.1") == ((), ("10.250.0.1",))


def test_image_pull_secret_is_a_valid_dockerconfigjson_for_the_host() -> None:
    secret = registry.image_pull_secret("pull", "ml", HOST, "ftjob", "s3cret")
    kubernetes_validate.validate(secret, bins.K8S_VERSION, strict=True)
    config = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
    entry = config["auths"][HOST]
    assert base64.b64decode(entry["auth"]).decode() == "ftjob:s3cret"
    assert (entry["username"], entry["password"]) == ("ftjob", "s3cret")


def test_htpasswd_entry_is_bcrypt_and_checks_the_password() -> None:
    user, hashed = registry.htpasswd_entry("ftjob", "s3cret").rstrip("\n").split(":", 1)
    assert user == "ftjob" and hashed.startswith("$2b$04$")
    assert bcrypt.checkpw(b"s3cret", hashed.encode()) and not bcrypt.checkpw(b"other", hashed.encode())
    with pytest.raises(ValueError, match="cannot contain ':'"):
        registry.htpasswd_entry("a:b", "x")


def test_registry_config_serves_tls_with_htpasswd_on_loopback(tmp_path: Path) -> None:
    config = registry.registry_config(
        "127.0.0.1:5443", tmp_path / "storage", tmp_path / "c.crt", tmp_path / "c.key", tmp_path / "htpasswd", "x"
    )
    assert config["http"]["addr"].startswith("127.0.0.1:")
    assert config["http"]["tls"] == {"certificate": str(tmp_path / "c.crt"), "key": str(tmp_path / "c.key")}
    assert config["auth"] == {"htpasswd": {"realm": registry.REALM, "path": str(tmp_path / "htpasswd")}}
    assert config["storage"]["filesystem"] == {"rootdirectory": str(tmp_path / "storage")}


def test_registry_and_prometheus_are_module_tools_pinned_by_their_go_mod() -> None:
    """Each go.mod requires the release bins builds (module_dir checks the same at build time)."""
    for name, module, version in [
        ("registry", "github.com/distribution/distribution/v3", bins.REGISTRY_VERSION),
        ("prometheus", "github.com/prometheus/prometheus", bins.PROMETHEUS_VERSION),
    ]:
        tool = bins.MODULE_TOOLS[name]
        go_mod = (tool.directory / "go.mod").read_text()
        assert f"tool {tool.package}\n" in go_mod
        assert f"\t{module} {version} " in go_mod, name
        # A folder per version and build tags: checkouts that build other tags never overwrite each other's binary.
        assert tool.bin_dir() == bins.cache_root() / tool.directory.name / "+".join((version, *tool.tags)) / "bin"
    assert bins.MODULE_TOOLS["prometheus"].tags == ("remove_all_sd", "enable_kubernetes_sd")
    assert bins.MODULE_TOOLS["registry"].bin_dir().parent.name == bins.REGISTRY_VERSION
