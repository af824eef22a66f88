"""The one plugin manager: hookspecs, built-in plugins, then third-party plugins by entry point."""

from __future__ import annotations

import importlib
import os

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
