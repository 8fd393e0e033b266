"""STAND-IN for vllm/distributed/parallel_state.py: the worker's TP rank and size (set by the
test's worker process, as vLLM's init_distributed_environment does)."""
_TP = (0, 1)


def init(rank: int, size: int) -> None:
    global _TP
    _TP = (rank, size)


def get_tensor_model_parallel_rank() -> int:
    return _TP[0]


def get_tensor_model_parallel_world_size() -> int:
    return _TP[1]
