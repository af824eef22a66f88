"""Plugin machinery: hook specifications and the plugin manager."""

import pluggy

hookimpl = pluggy.HookimplMarker("specexec")

from .manager import get_plugin_manager  # noqa: E402

__all__ = ["get_plugin_manager", "hookimpl"]
