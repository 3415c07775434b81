"""LLM providers: one small client over the OpenAI-compatible and Anthropic SDKs.

The SDKs are imported lazily, so the package works without them. API keys live only in the environment and inside the
SDK client objects: settings hold the *names* of variables, and error messages are scrubbed of the key.
"""
from __future__ import annotations

import json
import logging
import math
import os
import random
import threading
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PROVIDERS = ("openai", "anthropic")
ERROR_KINDS = ("timeout", "rate_limit", "server", "auth", "bad_request", "connection", "missing_sdk", "missing_key",
               "empty")
_DEFAULT_KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
_NO_KEY = "unused"  # local servers (vLLM, SGLang, Ollama, llama.cpp) ignore the key, but the SDKs insist on one


class LLMConfigError(ValueError):
    """A bad model list or LLM config file."""


class LLMError(Exception):
    """A failed LLM call: ``kind`` (one of ERROR_KINDS), ``model``, and ``status``, the HTTP status if any."""

    def __init__(self, kind: str, model: str, detail: str, status: int | None = None) -> None:
        super().__init__(f"{model}: {kind}: {detail}")
        self.kind, self.model, self.detail, self.status = kind, model, detail, status

    def __reduce__(self) -> tuple[Any, ...]:
        return LLMError, (self.kind, self.model, self.detail, self.status)


@dataclass(frozen=True)
class ModelSpec:
    """One model endpoint. ``key_env`` names the variable holding the key (None: the SDK's usual one)."""

    name: str
    provider: str = "openai"
    base_url: str | None = None
    key_env: str | None = None
    weight: float = 1.0
    price_in: float | None = None  # USD per million input tokens
    price_out: float | None = None  # USD per million output tokens

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise LLMConfigError(f"model name must be a non-empty string, got {self.name!r}")
        if self.provider not in PROVIDERS:
            raise LLMConfigError(f"model {self.name}: provider must be one of {', '.join(PROVIDERS)}, "
                                 f"got {self.provider!r}")
        if not _is_number(self.weight) or not (math.isfinite(self.weight) and self.weight > 0):
            raise LLMConfigError(f"model {self.name}: weight must be a positive number, got {self.weight!r}")
        for attr in ("price_in", "price_out"):
            price = getattr(self, attr)
            if price is not None and (not _is_number(price) or not math.isfinite(price) or price < 0):
                raise LLMConfigError(f"model {self.name}: {attr} must be a non-negative number, got {price!r}")
        for attr in ("base_url", "key_env"):
            if getattr(self, attr) is not None and not isinstance(getattr(self, attr), str):
                raise LLMConfigError(f"model {self.name}: {attr} must be a string")

    def cost(self, input_tokens: int, output_tokens: int) -> float | None:
        if self.price_in is None or self.price_out is None:
            return None
        return input_tokens * self.price_in / 1e6 + output_tokens * self.price_out / 1e6


@dataclass(frozen=True)
class LLMSettings:
    """Which models to call and how. Holds no secrets, so ``to_dict`` is safe to store with a run."""

    models: tuple[ModelSpec, ...]
    timeout_s: float = 120.0
    max_retries: int = 3  # the SDKs retry 408/409/429/5xx and connection errors, honouring retry-after
    concurrency: int = 4  # calls in flight at once, across all models
    max_tokens: int = 8192
    temperature: float | None = None  # OpenAI-compatible models only: the Anthropic SDK's create() takes none

    def __post_init__(self) -> None:
        object.__setattr__(self, "models", tuple(self.models))
        if not self.models or not all(isinstance(m, ModelSpec) for m in self.models):
            raise LLMConfigError("models must be a non-empty list of model specs")
        if not _is_number(self.timeout_s) or not self.timeout_s > 0:
            raise LLMConfigError(f"timeout_s must be a positive number, got {self.timeout_s!r}")
        for attr, low in (("max_retries", 0), ("concurrency", 1), ("max_tokens", 1)):
            value = getattr(self, attr)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise LLMConfigError(f"{attr} must be an integer >= {low}, got {value!r}")
        if self.temperature is not None and (not _is_number(self.temperature) or self.temperature < 0):
            raise LLMConfigError(f"temperature must be a non-negative number, got {self.temperature!r}")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "models": [asdict(m) for m in self.models]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LLMSettings:
        if not isinstance(d, dict):
            raise LLMConfigError(f"LLM settings must be a JSON object, got {type(d).__name__}")
        _check_keys(d, cls, "LLM settings")
        models = d.get("models")
        if not isinstance(models, list) or not models:
            raise LLMConfigError("'models' must be a non-empty list")
        specs = []
        for i, m in enumerate(models):
            if not isinstance(m, dict):
                raise LLMConfigError(f"models[{i}] must be an object, got {type(m).__name__}")
            _check_keys(m, ModelSpec, f"models[{i}]")
            if "name" not in m:
                raise LLMConfigError(f"models[{i}] has no 'name'")
            specs.append(ModelSpec(**m))
        return cls(**{**d, "models": tuple(specs)})


@dataclass(frozen=True)
class Completion:
    text: str
    model: str
    input_tokens: int
    output_tokens: int
    cost_usd: float | None
    latency_s: float


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_keys(d: dict[str, Any], cls: type, where: str) -> None:
    unknown = sorted(set(d) - {f.name for f in fields(cls)})
    if unknown:
        raise LLMConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")


def parse_models(text: str, provider: str = "openai", base_url: str | None = None,
                 key_env: str | None = None) -> tuple[ModelSpec, ...]:
    """Parse ``NAME[=WEIGHT],...`` (names may hold ':' and '/'), e.g. ``gpt-4o=2,qwen2.5-coder:32b=1``."""
    items = [item.strip() for item in text.split(",")]
    if not any(items):
        raise LLMConfigError("no model named")
    specs = []
    for item in items:
        name, eq, weight_text = item.rpartition("=") if "=" in item else (item, "", "")
        name = name.strip()
        if not name:
            raise LLMConfigError(f"empty model name in {text!r}")
        weight = 1.0
        if eq:
            try:
                weight = float(weight_text)
            except ValueError:
                raise LLMConfigError(f"model {name}: weight {weight_text.strip()!r} is not a number") from None
        specs.append(ModelSpec(name, provider=provider, base_url=base_url, key_env=key_env, weight=weight))
    return tuple(specs)


def load_llm_config(path: str | os.PathLike[str]) -> LLMSettings:
    """Read LLMSettings from a JSON file; every error names the file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise LLMConfigError(f"{path}: cannot read LLM config: {e.strerror or e}") from None
    except ValueError as e:
        raise LLMConfigError(f"{path}: not valid JSON: {e}") from None
    try:
        return LLMSettings.from_dict(data)
    except (LLMConfigError, TypeError) as e:
        raise LLMConfigError(f"{path}: {e}") from None


class UsageMeter:
    """Thread-safe token, cost and failure counts, overall and per model."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_model: dict[str, dict[str, Any]] = {}

    def _row(self, model: str) -> dict[str, Any]:
        return self._by_model.setdefault(model, {"calls": 0, "failures": 0, "input_tokens": 0, "output_tokens": 0,
                                                 "cost_usd": None, "failure_kinds": {}})

    def add(self, c: Completion) -> None:
        with self._lock:
            row = self._row(c.model)
            row["calls"] += 1
            row["input_tokens"] += c.input_tokens
            row["output_tokens"] += c.output_tokens
            if c.cost_usd is not None:
                row["cost_usd"] = (row["cost_usd"] or 0.0) + c.cost_usd

    def add_failure(self, model: str, kind: str) -> None:
        with self._lock:
            row = self._row(model)
            row["failures"] += 1
            row["failure_kinds"][kind] = row["failure_kinds"].get(kind, 0) + 1

    def totals(self) -> dict[str, Any]:
        """Sums plus ``by_model``; ``cost_usd`` is None when no call had a price."""
        with self._lock:
            by_model = {name: {**row, "failure_kinds": dict(row["failure_kinds"])}
                        for name, row in self._by_model.items()}
        total: dict[str, Any] = {"calls": 0, "failures": 0, "input_tokens": 0, "output_tokens": 0, "cost_usd": None,
                                 "failure_kinds": {}}
        for row in by_model.values():
            for key in ("calls", "failures", "input_tokens", "output_tokens"):
                total[key] += row[key]
            if row["cost_usd"] is not None:
                total["cost_usd"] = (total["cost_usd"] or 0.0) + row["cost_usd"]
            for kind, n in row["failure_kinds"].items():
                total["failure_kinds"][kind] = total["failure_kinds"].get(kind, 0) + n
        return {**total, "by_model": by_model}


class LLMClient:
    """Calls the configured models: weighted pick, bounded concurrency, one cached SDK client per model."""

    def __init__(self, settings: LLMSettings, seed: int | None = None) -> None:
        self.settings = settings
        self.usage = UsageMeter()
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(settings.concurrency)
        self._sdk_clients: dict[ModelSpec, Any] = {}
        self._sdk_lock = threading.Lock()
        self._token_param: dict[str, str] = {}  # model -> the name its server takes for the reply budget

    def __repr__(self) -> str:
        return f"LLMClient(models={[m.name for m in self.settings.models]})"

    def pick(self) -> ModelSpec:
        """A model drawn at random with probability proportional to its weight."""
        models = self.settings.models
        with self._rng_lock:
            return self._rng.choices(models, weights=[m.weight for m in models])[0]

    def complete(self, system: str, user: str, spec: ModelSpec | None = None) -> Completion:
        """One chat turn. Raises LLMError (and counts the failure) on any failure, including an empty reply."""
        spec = spec or self.pick()
        failure: LLMError | None = None
        text, n_in, n_out, latency = "", 0, 0, 0.0
        with self._slots:
            try:
                text, n_in, n_out, latency = self._call(spec, system, user)
            except LLMError as e:
                failure = e
        if failure is None and not text.strip():
            failure = LLMError("empty", spec.name, "the model returned no text")
        if failure is not None:  # raised outside any except block: no SDK exception (holding the request) is chained
            self.usage.add_failure(spec.name, failure.kind)
            log.info("LLM call failed: %s", failure)
            raise failure
        done = Completion(text, spec.name, n_in, n_out, spec.cost(n_in, n_out), latency)
        self.usage.add(done)
        log.debug("LLM call to %s: %d in, %d out tokens, %.2fs", spec.name, n_in, n_out, latency)
        return done

    def _call(self, spec: ModelSpec, system: str, user: str) -> tuple[str, int, int, float]:
        """(text, input tokens, output tokens, seconds spent on the request, retries included)."""
        sdk = _import_sdk(spec)
        client = self._sdk_client(spec, sdk)  # no local holds the key: tracebacks may be shown with their locals
        request = self._call_anthropic if spec.provider == "anthropic" else self._call_openai
        error = None
        start = time.monotonic()
        try:
            return (*request(client, spec, system, user), time.monotonic() - start)
        except sdk.APIError as e:  # the base of every HTTP and connection error in both SDKs
            error = _to_llm_error(sdk, e, spec.name)
        except getattr(sdk, "CredentialsError", ()) as e:
            error = LLMError("auth", spec.name, type(e).__name__)
        except _sdk_base_error(sdk) as e:  # refused by the SDK before sending, e.g. a bad argument
            error = LLMError("bad_request", spec.name, f"{type(e).__name__}: {e}")
        # raised outside the except block, so the SDK exception (whose request holds the key) is not chained
        raise LLMError(error.kind, error.model, self._scrub(spec, error.detail), error.status)

    def _call_openai(self, client: Any, spec: ModelSpec, system: str, user: str) -> tuple[str, int, int]:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        param = self._token_param.get(spec.name, "max_tokens")
        kwargs: dict[str, Any] = {"model": spec.name, param: self.settings.max_tokens, "messages": messages}
        if self.settings.temperature is not None:
            kwargs["temperature"] = self.settings.temperature
        try:
            resp = client.chat.completions.create(**kwargs)
        except Exception as e:
            # OpenAI's reasoning models refuse max_tokens and name its successor; ask again, and remember
            if param == "max_tokens" and getattr(e, "status_code", None) == 400 and "max_completion_tokens" in str(e):
                self._token_param[spec.name] = "max_completion_tokens"
                return self._call_openai(client, spec, system, user)
            raise
        text = (resp.choices[0].message.content or "") if resp.choices else ""
        usage = resp.usage
        return text, getattr(usage, "prompt_tokens", 0) or 0, getattr(usage, "completion_tokens", 0) or 0

    def _call_anthropic(self, client: Any, spec: ModelSpec, system: str, user: str) -> tuple[str, int, int]:
        kwargs: dict[str, Any] = {"model": spec.name, "system": system, "max_tokens": self.settings.max_tokens,
                                  "messages": [{"role": "user", "content": user}]}
        resp = client.messages.create(**kwargs)
        text = "".join(block.text for block in resp.content or [] if getattr(block, "type", None) == "text")
        usage = resp.usage
        return text, getattr(usage, "input_tokens", 0) or 0, getattr(usage, "output_tokens", 0) or 0

    def _sdk_client(self, spec: ModelSpec, sdk: Any) -> Any:
        with self._sdk_lock:
            if spec not in self._sdk_clients:
                cls = sdk.Anthropic if spec.provider == "anthropic" else sdk.OpenAI
                self._sdk_clients[spec] = cls(api_key=_resolve_key(spec), base_url=spec.base_url,
                                              timeout=self.settings.timeout_s, max_retries=self.settings.max_retries)
            return self._sdk_clients[spec]

    def _scrub(self, spec: ModelSpec, text: str) -> str:
        """Mask the key in text that came back from a server (an error body may echo the request)."""
        with self._sdk_lock:
            client = self._sdk_clients.get(spec)
        secret = getattr(client, "api_key", None)
        if isinstance(secret, str) and secret and secret != _NO_KEY:
            text = text.replace(secret, "***")
        return text


def _import_sdk(spec: ModelSpec) -> Any:
    try:
        if spec.provider == "anthropic":
            import anthropic as sdk
        else:
            import openai as sdk
    except ImportError:
        raise LLMError("missing_sdk", spec.name,
                       f"the {spec.provider} package is not installed; pip install {spec.provider}") from None
    return sdk


def _sdk_base_error(sdk: Any) -> type[Exception]:
    return sdk.AnthropicError if sdk.__name__ == "anthropic" else sdk.OpenAIError


def _resolve_key(spec: ModelSpec) -> str:
    var = spec.key_env or _DEFAULT_KEY_ENV[spec.provider]
    key = os.environ.get(var, "").strip()
    if key:
        return key
    if spec.key_env is None and spec.base_url:
        return _NO_KEY
    hint = "" if spec.key_env else " (or give a base_url for a local server that needs no key)"
    raise LLMError("missing_key", spec.name, f"environment variable {var} is not set{hint}")


def _to_llm_error(sdk: Any, e: Exception, model: str) -> LLMError:
    status = getattr(e, "status_code", None)
    if isinstance(e, sdk.APITimeoutError) or status == 408:
        kind = "timeout"
    elif isinstance(e, sdk.APIConnectionError):
        kind = "connection"
    elif isinstance(e, sdk.RateLimitError):
        kind = "rate_limit"
    elif isinstance(e, (sdk.AuthenticationError, sdk.PermissionDeniedError)):
        kind = "auth"
    elif isinstance(e, sdk.InternalServerError) or (status is not None and status >= 500):
        kind = "server"
    elif isinstance(e, sdk.APIResponseValidationError):
        kind = "server"  # a 2xx whose body does not fit the API: the server is at fault
    else:
        kind = "bad_request"
    return LLMError(kind, model, f"{type(e).__name__}: {e}", status)
