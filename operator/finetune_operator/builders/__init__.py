"""Pure builders: validated FineTuneJob (+ profile data) -> the Kubernetes objects it owns. No I/O.

`ftjob render`, `ftjob run`, the operator and the tests all call `desired()`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .flavors import Placement
from .images import default_image
from .layout import Layout, resolve
from .names import Names
from .objects import SshKeys, config_map, network_policy, owner_reference, service, ssh_secret
from .pods import mpi_pods, torchrun_pods

__all__ = ["Desired", "Layout", "Names", "Placement", "SshKeys", "desired", "image_for", "owner_reference", "resolve"]


@dataclass(frozen=True)
class Desired:
    """What `desired()` builds: every object the job's spec calls for (the children it should have, not the
    ones it has)."""

    layout: Layout
    names: Names
    objects: list[dict[str, Any]]  # Service, ConfigMap, Secret: created once, never recreated by restarts
    pods: list[dict[str, Any]]  # recreated on every group restart (attempt label)

    def all(self) -> list[dict[str, Any]]:
        return self.objects + self.pods


def image_for(job: dict[str, Any], layout: Layout, images: Mapping[str, Any] | None) -> str:
    """spec.image, else the stack's repository with the operator's registry and tag (builders.images)."""
    return str(job["spec"].get("image") or default_image(layout.stack.image_repository, images))


def desired(
    job: dict[str, Any],
    *,
    images: Mapping[str, Any] | None = None,
    ssh_keys: SshKeys | None = None,
    attempt: int = 0,
    network_policy_config: Mapping[str, Any] | None = None,
    placements: Mapping[str, Placement] | None = None,
) -> Desired:
    """Every child of `job` (validated, defaults applied); `images` is the operator config's `images` block
    (registry and tag of the profiles' default images, builders.images). MPI jobs get their SSH Secret only when
    `ssh_keys` are given: the operator makes keys only for a job whose (immutable) Secret does not exist yet,
    `ftjob render` always. With the operator's `networkPolicy: {enabled: true, extraIngress: [...]}`, a
    NetworkPolicy isolates the job's pods. `placements` (pod role -> Placement) are what an admitted job's Kueue
    flavors add to its pods' node selector and tolerations (builders.flavors)."""
    layout = resolve(job)
    names = Names.of(job, layout.launcher)
    image = image_for(job, layout, images)
    objects = [service(job, layout, names), config_map(job, layout, names)]
    if network_policy_config and network_policy_config.get("enabled"):
        objects.append(network_policy(job, names, list(network_policy_config.get("extraIngress") or [])))
    if layout.launcher == "mpi":
        if ssh_keys is not None:
            objects.append(ssh_secret(job, layout, names, ssh_keys))
        pods = mpi_pods(job, layout, names, image, attempt, placements)
    else:
        pods = torchrun_pods(job, layout, names, image, attempt, placements)
    # Independent copies: callers mutate and serialise them freely.
    return Desired(layout, names, tree_copy(objects), tree_copy(pods))


def tree_copy(value: Any) -> Any:
    """A copy of a JSON-shaped tree (dicts, lists, tuples of scalars) that shares no container with the original
    or within itself. copy.deepcopy does the same with a memo and type dispatch, which cost more than the copy; it
    was the largest share of the operator's CPU per pass (reconcile calls desired() on every pass; docs/operator.md,
    "CPU per watch event")."""
    kind = type(value)
    if kind is dict:
        return {k: tree_copy(v) for k, v in value.items()}
    if kind is list:
        return [tree_copy(v) for v in value]
    if kind is tuple:
        return tuple([tree_copy(v) for v in value])
    return value
