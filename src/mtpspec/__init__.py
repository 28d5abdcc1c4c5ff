"""mtpspec: exact speculative decoding for frozen Hugging Face causal LMs with a zero-copy
multi-token-prediction head that cross-attends to the target's own KV cache."""

from .config import AcceptanceConfig, HeadConfig, SamplingConfig
from .core.cache import KVCache
from .core.decode import DecodeState, GenerateOutput, Round, generate, prefill, step
from .core.draft import Draft, Drafter, DraftInput
from .core.head import MTPHead
from .core.stats import DecodeStats
from .core.target import SUPPORTED, Target
from .errors import DataError, HeadMismatchError, InputError, MtpspecError, UnsupportedModelError

__version__ = "0.1.0"

__all__ = [
    "SUPPORTED",
    "AcceptanceConfig",
    "DataError",
    "DecodeState",
    "DecodeStats",
    "Draft",
    "DraftInput",
    "Drafter",
    "GenerateOutput",
    "HeadConfig",
    "HeadMismatchError",
    "InputError",
    "KVCache",
    "MTPHead",
    "MtpspecError",
    "Round",
    "SamplingConfig",
    "Target",
    "UnsupportedModelError",
    "generate",
    "prefill",
    "step",
]
