"""Creates a job loop made that the watch-fed indexes may not show yet (controller-runtime calls these
"expectations"). The indexes can lag one watch event behind the loop's own creates: a pass woken by the first
of a wide job's pod events must not create the others again. Unit-tested alone with a fake clock
(tests/unit/test_expectations.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .reconcile import controller_uid, slim_child, slim_workload

# A child created by the loop counts as existing until a watch event on it arrives or the index shows it, for at
# most this long (then a create again meets a 409 and reads it back).
CREATED_MEMORY_S = 30.0
# Kinds the operator creates but does not watch (handlers.py): the loop remembers the ones it made or found to be
# its own for as long as it runs. A new loop (operator restart) creates again and reads the 409 back once.
UNWATCHED_KINDS = ("Secret",)


def _ref(obj: dict[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


class Expectations:
    """- `created`: "Kind/name" -> (the object as the index would hold it, clock time) of watched children the
      loop created that no watch event has shown yet;
    - `made`: "Kind/name" -> job uid of the unwatched children (UNWATCHED_KINDS) the loop created or found to be
      the job's own, so that an MPI job's key pair is made once."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.created: dict[str, tuple[dict[str, Any], float]] = {}
        self.made: dict[str, str] = {}

    def expect(self, uid: str, planned: list[dict[str, Any]], created: list[dict[str, Any]]) -> None:
        """After a pass's creates all succeeded or met a 409 on an object the job controls: `planned` (every
        object the plan created) and `created` (those made now). Only what was made now is expected: an object
        that existed already is shown by the index, or soon will be (a 409 read-back restores the labels it is
        watched by), and a Workload taken from the plan's own copy would read as not admitted."""
        self.made.update({_ref(o): uid for o in planned if o["kind"] in UNWATCHED_KINDS})
        at = self.clock()
        self.created.update(
            {
                _ref(o): (slim_workload(o) if o["kind"] == "Workload" else slim_child(o), at)
                for o in created
                if o["kind"] not in UNWATCHED_KINDS
            }
        )

    def seen(self, ref: str) -> None:
        """A watch event on the child `ref`: the index holds its newest state from now on."""
        self.created.pop(ref, None)

    def add_to(
        self, pods: list[dict[str, Any]], objects: dict[str, str | None], workloads: list[dict[str, Any]]
    ) -> None:
        """Adds to the indexes' children (a pass's own copies) what the loop made that they do not show: the
        creates not yet seen (forgotten once shown, or after CREATED_MEMORY_S) and the unwatched children."""
        now = self.clock()
        shown = {f"Pod/{p['metadata']['name']}" for p in pods} | objects.keys()
        shown |= {f"Workload/{w['metadata']['name']}" for w in workloads}
        for ref, (obj, at) in list(self.created.items()):
            if ref in shown or now - at > CREATED_MEMORY_S:
                del self.created[ref]
            elif obj["kind"] == "Pod":
                pods.append(obj)
            elif obj["kind"] == "Workload":
                workloads.append(obj)
            else:
                objects[ref] = controller_uid(obj)
        objects.update(self.made)
