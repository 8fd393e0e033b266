"""STAND-IN for vllm/utils/func_utils.py: supports_kw, which vLLM's newer connector factory uses to
refuse a connector whose constructor takes no kv_cache_config."""
import inspect


def supports_kw(callable, kw_name: str, *, requires_kw_only: bool = False, allow_var_kwargs: bool = True) -> bool:
    params = inspect.signature(callable).parameters
    if not params:
        return False
    kinds = {inspect.Parameter.KEYWORD_ONLY} if requires_kw_only else {
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY}
    p = params.get(kw_name)
    if p is not None and p.kind in kinds:
        return True
    last = params[next(reversed(params))]
    return allow_var_kwargs and last.kind == inspect.Parameter.VAR_KEYWORD and last.name != kw_name
