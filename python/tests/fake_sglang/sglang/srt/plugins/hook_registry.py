"""STAND-IN for sglang.srt.plugins.hook_registry: AROUND/REPLACE hooks on a dotted target, applied
by rebinding the attribute and every module-level name bound to the original."""
import functools
import pkgutil
import sys
from enum import Enum


class HookType(Enum):
    BEFORE = "before"
    AFTER = "after"
    AROUND = "around"
    REPLACE = "replace"


class HookRegistry:
    _hooks = {}

    @classmethod
    def register(cls, target, hook, hook_type=HookType.AFTER):
        cls._hooks.setdefault(target, []).append((hook_type, hook))

    @classmethod
    def apply_hooks(cls):
        for target, hooks in cls._hooks.items():
            owner_path, name = target.rsplit(".", 1)
            owner = pkgutil.resolve_name(owner_path)
            original = fn = getattr(owner, name)
            for hook_type, hook in hooks:
                if hook_type == HookType.AROUND:
                    fn = functools.partial(hook, fn)
                elif hook_type == HookType.REPLACE:
                    fn = hook
            setattr(owner, name, fn)
            for mod in list(sys.modules.values()):
                for k, v in list(vars(mod).items()) if mod is not None else []:
                    if v is original and mod is not owner:
                        setattr(mod, k, fn)
        cls._hooks = {}
