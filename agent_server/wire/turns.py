"""The wire schemas of turns (contract §6, §7): what `/api/task` and `/api/chat` take
and give, and the rate-limit reading a turn's metadata carries."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    WithJsonSchema,
    model_validator,
)

from agent_server.wire.names import AuthOverrideKind, AuthRoute
from agent_server.wire.values import (
    ArgValue,
    ExecutionId,
    PromptText,
    Secret,
    Strict,
    check_url,
    exactly_one_property,
)


class ProviderOverride(Strict):
    """Route one turn to an Anthropic-compatible gateway."""

    base_url: Annotated[
        str,
        AfterValidator(check_url),
        WithJsonSchema(
            {
                "type": "string",
                "pattern": r"^https?://[^/\s\x00-\x1f\x7f\x85][^\s\x00-\x1f\x7f\x85]*$",
            }
        ),
    ]
    auth_token: Secret
    model: ArgValue | None = None


class AuthOverride(Strict):
    """Exactly one credential for exactly one spawn; never persisted."""

    model_config = ConfigDict(
        extra="forbid",
        hide_input_in_errors=True,
        json_schema_extra=lambda schema: exactly_one_property(schema),
    )

    oauth_token: Secret | None = None
    api_key: Secret | None = None
    provider: ProviderOverride | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> AuthOverride:
        given = [k for k in ("oauth_token", "api_key", "provider") if getattr(self, k) is not None]
        if len(given) != 1:
            msg = "auth_override takes exactly one of oauth_token, api_key, provider"
            raise ValueError(msg)
        return self

    @property
    def secret(self) -> SecretStr:
        """The one secret it carries (a provider's `auth_token`)."""
        if self.provider is not None:
            return self.provider.auth_token
        secret = self.oauth_token or self.api_key
        assert secret is not None  # noqa: S101 - validated: exactly one is given
        return secret

    @property
    def kind(self) -> AuthOverrideKind:
        """Which of the three this override is."""
        if self.oauth_token is not None:
            return "oauth_token"
        return "api_key" if self.api_key is not None else "provider"


MAX_LADDER = 8
AuthLadder = Annotated[list[AuthOverride], Field(min_length=1, max_length=MAX_LADDER)]
"""More credentials for one turn, in order after its `auth_override` (contract §6.2)."""


MAX_IMAGES = 10
MAX_IMAGE_BYTES = 5 * 1024 * 1024
MAX_IMAGES_BYTES = 10 * 1024 * 1024
"""Per turn: what a controller's channel adapters send at most (decoded bytes)."""


BASE64 = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{4})$"
"""Standard base64 with its padding, at least one byte."""


def decoded_size(data: str) -> int:
    """The bytes that padded base64 `data` decodes to (counted, not decoded)."""
    return len(data) * 3 // 4 - data.count("=", -2)


def _check_size(value: str) -> str:
    if decoded_size(value) > MAX_IMAGE_BYTES:
        msg = f"must decode to at most {MAX_IMAGE_BYTES} bytes"
        raise ValueError(msg)
    return value


class ImageInput(Strict):
    """One image for the model to see: its media type and its bytes in base64."""

    media_type: Literal["image/png", "image/jpeg", "image/gif", "image/webp"]
    data: Annotated[
        str,
        Field(pattern=BASE64, json_schema_extra={"contentEncoding": "base64"}),
        AfterValidator(_check_size),
    ]

    @property
    def size(self) -> int:
        """The decoded size in bytes."""
        return decoded_size(self.data)


Images = Annotated[list[ImageInput], Field(min_length=1, max_length=MAX_IMAGES)]


def _check_total(images: list[ImageInput] | None) -> None:
    if images and sum(image.size for image in images) > MAX_IMAGES_BYTES:
        msg = f"images must decode to at most {MAX_IMAGES_BYTES} bytes in all"
        raise ValueError(msg)


class ParallelTaskRequest(BaseModel):
    """`POST /api/task`: one stateless turn (unknown fields are ignored, for the controller)."""

    model_config = ConfigDict(hide_input_in_errors=True)

    message: Annotated[str, Field(min_length=1)]
    model: ArgValue | None = None
    allowed_tools: list[ArgValue] | None = None
    system_prompt: PromptText | None = None
    timeout_seconds: Annotated[int, Field(ge=1, le=86400)] = 900
    max_turns: Annotated[int, Field(ge=1, le=10000)] | None = None
    execution_id: ExecutionId | None = None
    resume_session_id: ArgValue | None = None
    persist_session: bool = True
    async_result: bool = False
    auth_override: AuthOverride | None = None
    auth_ladder: AuthLadder | None = None
    images: Images | None = None

    @model_validator(mode="after")
    def _images_fit(self) -> ParallelTaskRequest:
        _check_total(self.images)
        return self


class ChatRequest(BaseModel):
    """`POST /api/chat`: one turn of the agent's ongoing chat session."""

    model_config = ConfigDict(hide_input_in_errors=True)

    message: Annotated[str, Field(min_length=1)]
    model: ArgValue | None = None
    system_prompt: PromptText | None = None
    execution_id: ExecutionId | None = None
    auth_override: AuthOverride | None = None
    auth_ladder: AuthLadder | None = None
    images: Images | None = None

    @model_validator(mode="after")
    def _images_fit(self) -> ChatRequest:
        _check_total(self.images)
        return self


RateLimitStatus = Literal["allowed", "allowed_warning", "rejected", "other"]
"""What the provider said of a credential's window: `other` for a word not known here."""


class RateLimitWindow(BaseModel):
    """One usage window of a subscription (five-hour or seven-day) as the provider read it."""

    utilization: float | None = None
    """The fraction of the window used, 0 to 1 (a little over 1 while on overage)."""
    resets_at: str | None = None
    """When the window resets: ISO 8601 UTC, `…Z`."""
    status: RateLimitStatus | None = None


class RateLimitReading(BaseModel):
    """The provider's last rate-limit reading of a turn: how much headroom its credential
    has (contract §6.5). Claude Code only; every field checked, unknown ones dropped."""

    status: RateLimitStatus | None = None
    rate_limit_type: str | None = None
    """The window the status speaks for (`five_hour`, `seven_day`, …, `other`)."""
    resets_at: str | None = None
    utilization: float | None = None
    surpassed_threshold: float | None = None
    is_using_overage: bool | None = None
    overage_status: RateLimitStatus | None = None
    overage_resets_at: str | None = None
    overage_disabled_reason: str | None = None
    five_hour: RateLimitWindow | None = None
    seven_day: RateLimitWindow | None = None


class CredentialRefusal(BaseModel):
    """One refusal the API gave a credential of a turn's ladder."""

    error_code: str
    api_error_status: int | None = None
    resets_at: str | None = None
    rate_limit_type: str | None = None


class CredentialUse(BaseModel):
    """One credential of a turn's ladder: how many requests it served, how it was refused."""

    rung: int
    """0: the turn's `auth_override`; 1 on: the ladder's entries, in order."""
    auth_route: AuthRoute
    fingerprint: str | None
    served: int
    refusals: list[CredentialRefusal] = []


class TurnMetadata(BaseModel):
    """What the controller records about one turn."""

    execution_id: str
    session_id: str | None = None
    model: str | None = None
    cost_usd: float | None = None
    duration_ms: int | None = None
    num_turns: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int = 0
    """Read from the prompt cache by the turn's last model call (0 when not reported)."""
    cache_creation_tokens: int = 0
    """Written to the prompt cache by the turn's last model call (0 when not reported)."""
    context_window: int
    """The model's context window, in tokens: as the CLI reports it, else by model family."""
    exit_code: int | None = None
    auth_route: AuthRoute
    generation: int
    fingerprint: str | None = None
    api_key_source: str | None = None
    log_truncated: bool = False
    session_reset: bool = False
    rate_limit: RateLimitReading | None = None
    """The provider's last rate-limit reading of the turn (Claude Code reports one on every
    turn whose API answers carry it), success or failure; null when there was none."""
    not_enforced: list[str] = []
    """Asked turn fields the runtime took without enforcing them (contract §6.1)."""
    credentials: list[CredentialUse] | None = None
    """With an `auth_ladder`: every credential the turn used, its own first (§6.2)."""
    api_requests: int | None = None
    """How many of the turn's requests reached the API through the broker (contract §4.8);
    null when the turn ran without one. 0: no credential served or failed this turn."""


class ChatContext(BaseModel):
    """`/api/chat` only: the chat session and how full its context window is."""

    session_id: str | None
    context_tokens: int
    """The context the last model call sent: its input plus cache reads and writes."""
    context_window: int


class TurnResponse(BaseModel):
    """A turn that served (`success`) or was cancelled through the terminate route."""

    status: Literal["success", "cancelled"]
    response: str
    execution_log: list[Any]
    session_id: str | None
    timestamp: str
    metadata: TurnMetadata
    session: ChatContext | None = None
    """Set on `/api/chat` answers."""


class RunningExecution(BaseModel):
    """One turn in flight, or accepted and waiting for the chat (`queued`)."""

    execution_id: str
    started_at: str
    auth_route: AuthRoute
    generation: int
    state: Literal["queued", "running"]
    last_event: str | None = None
    """The CLI's last event: its `type`, or `type/subtype` for a system event
    (`system/api_retry` while the CLI retries the API itself); null before the first."""
    last_event_at: str | None = None
    """When that event came (ISO 8601, UTC)."""
    last_event_age_s: float | None = None
    """How long ago, in seconds (a turn with nothing new for long is a stuck one)."""


class RunningExecutions(BaseModel):
    """`GET /api/executions/running`."""

    executions: list[RunningExecution]
    recently_completed_ids: list[str]
    pending_ids: list[str]
    """The ids of `executions` that are `queued` (accepted, not spawned yet)."""


class AsyncAccepted(BaseModel):
    """`202` to an async `/api/task`: the turn runs; its result comes by callback."""

    execution_id: str
    status: Literal["accepted"]


class TerminateResponse(BaseModel):
    """`POST /api/executions/{id}/terminate`."""

    status: Literal["terminated", "already_finished"]
