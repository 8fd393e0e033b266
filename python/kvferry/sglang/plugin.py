"""The SGLang plugin: entry point ``kvferry = kvferry.sglang.plugin:register`` in the group
``sglang.srt.plugins`` (installed with the package: kvferry-*.dist-info/entry_points.txt).

SGLang's plugin loader calls ``register()`` early in each process (only if ``SGLANG_PLUGINS`` is
unset or names ``kvferry``). It
  * adds ``kvferry`` to ``--disaggregation-transfer-backend``'s choices
    (``server_args.add_disagg_transfer_backend_choices``),
  * gives SGLang's ``TransferBackend`` enum a ``KVFERRY = "kvferry"`` member, so
    ``TransferBackend(server_args.disaggregation_transfer_backend)`` accepts the name,
  * wraps ``sglang.srt.disaggregation.utils.get_kv_class`` (an AROUND hook in SGLang's
    HookRegistry, which also rebinds the modules that imported it) so that it returns kvferry's
    classes for that member and SGLang's own for every other backend.
Nothing of SGLang is edited on disk. Without SGLang importable, register() does nothing.
"""
from __future__ import annotations

import logging

logger = logging.getLogger("kvferry.sglang")

TARGET = "sglang.srt.disaggregation.utils.get_kv_class"
_done = False


def _add_enum_member(enum_cls, name: str, value: str):
    """An extra member of an existing Enum (Python has no public way to add one)."""
    try:
        return enum_cls(value)
    except ValueError:
        pass
    member = object.__new__(enum_cls)
    member._name_ = name
    member._value_ = value
    member.__objclass__ = enum_cls
    type.__setattr__(enum_cls, name, member)
    enum_cls._member_map_[name] = member
    enum_cls._value2member_map_[value] = member
    if name not in enum_cls._member_names_:
        enum_cls._member_names_.append(name)
    return member


def is_kvferry(transfer_backend) -> bool:
    return getattr(transfer_backend, "value", transfer_backend) == "kvferry"


def _get_kv_class_hook(original, transfer_backend, class_type, *args, **kwargs):
    if is_kvferry(transfer_backend):
        from . import kv_class
        return kv_class(class_type)
    return original(transfer_backend, class_type, *args, **kwargs)


def register() -> None:
    """Entry point of the plugin (see the module doc). Idempotent."""
    global _done
    if _done:
        return
    try:
        from sglang.srt import server_args as sg_server_args  # type: ignore
        from sglang.srt.disaggregation import utils as sg_utils  # type: ignore
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType  # type: ignore
    except ImportError as e:
        logger.debug("SGLang is not importable (%s): the kvferry plugin does nothing", e)
        return
    _done = True
    if "kvferry" not in getattr(sg_server_args, "DISAGG_TRANSFER_BACKEND_CHOICES", []):
        sg_server_args.add_disagg_transfer_backend_choices(["kvferry"])
    _add_enum_member(sg_utils.TransferBackend, "KVFERRY", "kvferry")
    HookRegistry.register(TARGET, _get_kv_class_hook, HookType.AROUND)
    logger.info("kvferry transfer backend registered (--disaggregation-transfer-backend kvferry)")
