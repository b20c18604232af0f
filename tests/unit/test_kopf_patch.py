"""handlers.daemon_without_finalizer: the one place the operator touches kopf's private daemon registry, and the
kopf version check that guards it. Real kopf registries; the version string is what changes."""

from __future__ import annotations

import importlib.metadata
from typing import Any

import kopf
import pytest

from finetune_operator import constants as c
from finetune_operator import handlers


async def daemon(**_: Any) -> None:
    return None


def test_the_installed_kopf_is_a_tested_one() -> None:
    """Importing handlers registered the job daemon, so the installed kopf passed the check."""
    assert importlib.metadata.version("kopf") in handlers.KOPF_TESTED


def test_the_daemon_is_registered_without_a_finalizer() -> None:
    registry = kopf.OperatorRegistry()
    handlers.daemon_without_finalizer(daemon, id="d", cancellation_timeout=3.0, registry=registry)
    [handler] = registry._spawning.get_all_handlers()
    assert (str(handler.id), handler.fn, handler.requires_finalizer) == ("d", daemon, False)
    assert handler.cancellation_timeout == 3.0
    [resource] = registry._spawning.get_all_selectors()
    assert (resource.group, resource.version, resource.any_name) == (c.GROUP, c.VERSION, c.PLURAL)


@pytest.mark.parametrize("version", ["1.44.5", "1.46.0", "2.0.0"])
def test_an_untested_kopf_fails_loudly_naming_the_tested_ones(version: str) -> None:
    registry = kopf.OperatorRegistry()
    with pytest.raises(handlers.UntestedKopf) as err:
        handlers.daemon_without_finalizer(
            daemon, id="d", cancellation_timeout=3.0, registry=registry, kopf_version=version
        )
    assert f"kopf {version} is installed" in str(err.value)
    assert all(tested in str(err.value) for tested in handlers.KOPF_TESTED)
    assert registry._spawning.get_all_handlers() == []  # refused before touching any registry
