"""STAND-IN for vllm/v1/request.py: RequestStatus (names and order as vLLM's) and the Request
fields the connector reads (request_id, prompt_token_ids, num_prompt_tokens, num_computed_tokens,
kv_transfer_params, status)."""
import enum


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    WAITING_FOR_FSM = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()

    @staticmethod
    def is_finished(status) -> bool:
        return status > RequestStatus.PREEMPTED


class Request:
    def __init__(self, request_id: str, prompt_token_ids: list, max_tokens: int, kv_transfer_params=None):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self.max_tokens = max_tokens
        self.kv_transfer_params = kv_transfer_params
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.output_token_ids: list = []

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + len(self.output_token_ids)

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)
