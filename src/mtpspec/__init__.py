"""mtpspec: exact speculative decoding for frozen Hugging Face causal LMs with a zero-copy
multi-token-prediction head that cross-attends to the target's own KV cache."""

from .config import HeadConfig, SamplingConfig
from .core.decode import DecodeStats, GenerateOutput, generate
from .core.draft import Draft, Drafter, DraftInput
from .errors import DataError, HeadMismatchError, InputError, MtpspecError, UnsupportedModelError
from .core.head import MTPHead
from .core.target import SUPPORTED, Target

__version__ = "0.1.0"

__all__ = [
    "SUPPORTED",
    "DataError",
    "DecodeStats",
    "Draft",
    "DraftInput",
    "Drafter",
    "GenerateOutput",
    "HeadConfig",
    "HeadMismatchError",
    "InputError",
    "MTPHead",
    "MtpspecError",
    "SamplingConfig",
    "Target",
    "UnsupportedModelError",
    "generate",
]
