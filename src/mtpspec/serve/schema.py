"""OpenAI-compatible request bodies, validated strictly: a wrong type is a 400 with the field's
name, never a silent coercion ("5" is not a number, true is not a count). Fields OpenAI
defines that change nothing here (user, presence_penalty = 0, ...) are accepted and ignored."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, field_validator

from ..config import AcceptanceConfig, SamplingConfig

Number = StrictInt | StrictFloat
MAX_STOP_LEN = 256  # characters in one stop string: they are held back while streaming


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class TextPart(_Strict):
    type: Literal["text"]
    text: StrictStr


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[TextPart] | None = None

    def as_template_input(self) -> dict[str, str]:
        """What the chat template sees: a text content (parts joined)."""
        c = self.content
        text = "" if c is None else c if isinstance(c, str) else "".join(p.text for p in c)
        return {"role": self.role, "content": text}


class StreamOptions(_Strict):
    include_usage: StrictBool = False


class _Sampling(_Strict):
    """The fields chat and completion requests share."""

    model: StrictStr | None = None
    max_tokens: StrictInt | None = None
    temperature: Annotated[Number, Field(ge=0, le=100)] | None = None  # None: 1.0, as OpenAI
    top_p: Annotated[Number, Field(gt=0, le=1)] | None = None
    top_k: Annotated[StrictInt, Field(ge=0)] | None = None  # not OpenAI's; vLLM and llama.cpp have it
    seed: StrictInt | None = None
    stop: StrictStr | list[StrictStr] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: Annotated[StrictInt, Field(ge=1, le=1)] = 1  # one sequence per request
    # mtpspec's own: the acceptance rule, as `mtpspec generate --acceptance` reads it. None: exact
    # (the target's own output); a relaxed rule changes the output, and the reply says which.
    acceptance: StrictStr | None = None

    @field_validator("stop")
    @classmethod
    def _stop_lengths(cls, v: str | list[str] | None) -> str | list[str] | None:
        for s in [v] if isinstance(v, str) else v or []:
            if len(s) > MAX_STOP_LEN:
                raise ValueError(f"a stop string is at most {MAX_STOP_LEN} characters")
        return v

    def sampling(self) -> SamplingConfig:
        return SamplingConfig(temperature=1.0 if self.temperature is None else float(self.temperature),
                              top_k=self.top_k or 0, top_p=1.0 if self.top_p is None else float(self.top_p),
                              seed=self.seed)

    def acceptance_rule(self) -> AcceptanceConfig:
        """The request's rule; a malformed one is an InputError (400) that names the parameter."""
        return AcceptanceConfig.parse(self.acceptance)

    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    def token_limit(self) -> int | None:
        return self.max_tokens


class ChatRequest(_Sampling):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: StrictInt | None = None  # newer OpenAI name for max_tokens

    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Sampling):
    prompt: StrictStr | Annotated[list[StrictInt], Field(min_length=1)]  # text, or token ids
