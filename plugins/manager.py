"""The one plugin manager: hookspecs, built-in plugins, then third-party plugins by entry point."""

from __future__ import annotations

import dataclasses
import importlib
import os
from dataclasses import dataclass

import pluggy

from . import hookspecs

#: set to 1 to skip loading plugins from the `specexec` entry-point group
DISABLE_AUTOLOAD_ENV = "SPECEXEC_DISABLE_PLUGIN_AUTOLOAD"
#: modules registered in every manager
BUILTIN_PLUGINS: tuple[str, ...] = ("specexec.drafters.builtin",)


def get_plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager("specexec")
    pm.add_hookspecs(hookspecs)
    for name in BUILTIN_PLUGINS:
        pm.register(importlib.import_module(name), name=name)
    if not os.environ.get(DISABLE_AUTOLOAD_ENV):
        pm.load_setuptools_entrypoints("specexec")
    pm.check_pending()
    return pm


@dataclass(frozen=True, slots=True)
class DrafterListing:
    names: tuple[str, ...]  #: the decoding_type names of one factory (aliases share it)
    source: str  #: "built-in", or the plugin's distribution and version
    options: tuple[tuple[str, object], ...]  #: (option, default) of its declared options dataclass


def list_drafters(pm: pluggy.PluginManager) -> list[DrafterListing]:
    """Every drafter the manager knows, built-in first, with where it comes from and its options."""
    dists = {
        id(plugin): f"plugin {dist.project_name} {dist.version}" for plugin, dist in pm.list_plugin_distinfo()
    }
    listings = []
    for impl in pm.hook.specexec_drafter_factories.get_hookimpls():
        source = (
            "built-in"
            if impl.plugin_name in BUILTIN_PLUGINS
            else dists.get(id(impl.plugin), f"plugin {impl.plugin_name}")
        )
        by_factory: dict[int, list[str]] = {}
        factories = impl.function() or {}
        for name, factory in factories.items():
            by_factory.setdefault(id(factory), []).append(name)
        for names in by_factory.values():
            options_type = getattr(factories[names[0]], "options", None)
            options = ()
            if options_type is not None and dataclasses.is_dataclass(options_type):
                options = tuple(
                    (f.name, f.default if f.default is not dataclasses.MISSING else f.default_factory())
                    for f in dataclasses.fields(options_type)
                )
            listings.append(DrafterListing(tuple(names), source, options))
    return sorted(listings, key=lambda d: d.source != "built-in")
