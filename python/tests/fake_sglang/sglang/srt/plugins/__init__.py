"""STAND-IN for sglang.srt.plugins: general plugins are the entry points of group
"sglang.srt.plugins"; SGLANG_PLUGINS (comma-separated names) restricts which run; after they ran
the registered hooks are applied."""
import logging
import os
from importlib.metadata import entry_points

from .hook_registry import HookRegistry

GENERAL_PLUGINS_GROUP = "sglang.srt.plugins"
logger = logging.getLogger(__name__)
_loaded = False


def load_plugins():
    global _loaded
    if _loaded:
        return
    _loaded = True
    allowed = {x.strip() for x in os.environ.get("SGLANG_PLUGINS", "").split(",") if x.strip()} or None
    for ep in entry_points(group=GENERAL_PLUGINS_GROUP):
        if allowed is not None and ep.name not in allowed:
            continue
        ep.load()()
    HookRegistry.apply_hooks()
