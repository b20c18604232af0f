"""The node's build inputs and image plumbing, without starting a node (runs wherever the tier is collected)."""

from __future__ import annotations

import io
import json
import re
import tarfile

from ftjob_cluster import bins, node


def _tool_block(go_mod: str) -> set[str]:
    block = re.search(r"^tool \((.*?)^\)", go_mod, re.S | re.M)
    if block:
        return {line.strip() for line in block.group(1).splitlines() if line.strip()}
    return set(re.findall(r"^tool (\S+)$", go_mod, re.M))


def test_each_go_build_group_is_pinned_by_its_modules_tool_block() -> None:
    for build in bins.go_builds().values():
        tools = _tool_block((build.module / "go.mod").read_text())
        wanted = {p for p in build.packages.values() if not p.startswith("./")}
        assert wanted == tools, f"{build.module}/go.mod tool block {tools} != bins.py {wanted}"


def test_node_groups_leave_the_control_plane_stamp_alone() -> None:
    # The control plane's digest reads only its own module: node pieces never force its rebuild.
    builds = bins.go_builds()
    assert builds["control-plane"].module != builds["node"].module != builds["coredns"].module
    assert bins.go_inputs_digest("control-plane") != bins.go_inputs_digest("node")
    assert {"kubelet", "kube-proxy", "coredns"} <= set(bins.tool_names())


def test_pause_archive_is_a_docker_save_tarball() -> None:
    data = node._docker_archive({"pause": (b"\x7fELF", 0o755)}, node.PAUSE_IMAGE, {"Entrypoint": ["/pause"]})
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        manifest = json.loads(t.extractfile("manifest.json").read())  # type: ignore[union-attr]
        assert manifest[0]["RepoTags"] == [node.PAUSE_IMAGE]
        config = json.loads(t.extractfile(manifest[0]["Config"]).read())  # type: ignore[union-attr]
        with tarfile.open(fileobj=t.extractfile(manifest[0]["Layers"][0])) as layer:
            assert layer.getmember("pause").mode == 0o755
    assert config["config"]["Entrypoint"] == ["/pause"]
