"""The provider layer, driven through the real openai and anthropic clients against a scripted local server."""
from __future__ import annotations

import json
import logging
import pickle
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from kernelevolve.propose.providers import (Completion, LLMClient, LLMError, LLMSettings, ModelSpec, UsageMeter,
                                            load_llm_config, parse_models)
from llm_servers import Hang, Reply, ScriptedServer, Status

KEY_VAR = "KE_TEST_LLM_KEY"
SECRET = "sk-test-0d9f8e7a6b5c4d3e2f1a"
DEFAULT_VARS = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
# Variables the SDKs read on their own: cleared so a developer's environment cannot change what these tests see.
_SDK_ENV = ["OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID", "ANTHROPIC_API_KEY",
            "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL", "ANTHROPIC_CUSTOM_HEADERS", "ANTHROPIC_PROFILE",
            "ANTHROPIC_CONFIG_DIR", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"]


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in _SDK_ENV:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(KEY_VAR, SECRET)


@pytest.fixture(params=["openai", "anthropic"])
def provider(request: pytest.FixtureRequest) -> str:
    pytest.importorskip(request.param)
    return request.param


def url_for(srv: ScriptedServer, provider: str) -> str:
    return srv.openai_base_url if provider == "openai" else srv.anthropic_base_url


def make_client(srv: ScriptedServer, provider: str, name: str = "test-model", key_env: str | None = KEY_VAR,
                spec_kw: dict | None = None, **settings_kw) -> LLMClient:
    spec = ModelSpec(name, provider=provider, base_url=url_for(srv, provider), key_env=key_env, **(spec_kw or {}))
    return LLMClient(LLMSettings((spec,), **{"timeout_s": 5.0, "max_retries": 2, **settings_kw}), seed=0)


def sent_key(request: dict) -> str | None:
    headers = request["headers"]
    if "x-api-key" in headers:
        return headers["x-api-key"]
    auth = headers.get("authorization", "")
    return auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None


def expect_error(client: LLMClient, spec: ModelSpec | None = None) -> LLMError:
    with pytest.raises(LLMError) as info:
        client.complete("system", "user", spec)
    return info.value


# --- calls through the SDKs ---------------------------------------------------------------------------------------

def test_good_reply(provider: str) -> None:
    with ScriptedServer([Reply("def f(): pass", input_tokens=120, output_tokens=30)]) as srv:
        client = make_client(srv, provider, spec_kw={"price_in": 2.0, "price_out": 10.0})
        done = client.complete("be brief", "write f")
    assert isinstance(done, Completion)
    assert (done.text, done.model, done.input_tokens, done.output_tokens) == ("def f(): pass", "test-model", 120, 30)
    assert done.cost_usd == pytest.approx(120 * 2.0 / 1e6 + 30 * 10.0 / 1e6)
    assert 0 <= done.latency_s < 5
    [req] = srv.requests
    body = req["body"]
    assert body["model"] == "test-model" and body["max_tokens"] == 8192 and "temperature" not in body
    if provider == "openai":
        assert req["path"] == "/v1/chat/completions"
        assert body["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "write f"}]
    else:
        assert req["path"] == "/v1/messages"
        assert body["system"] == "be brief" and body["messages"] == [{"role": "user", "content": "write f"}]


def test_settings_reach_the_request(provider: str) -> None:
    with ScriptedServer([Reply("ok")]) as srv:
        make_client(srv, provider, temperature=0.25, max_tokens=321).complete("s", "u")
    body = srv.requests[0]["body"]
    assert body["max_tokens"] == 321
    # the Anthropic SDK's create() has no temperature parameter, so it only goes to OpenAI-compatible servers
    assert body.get("temperature") == (0.25 if provider == "openai" else None)


def test_server_that_wants_max_completion_tokens() -> None:
    pytest.importorskip("openai")
    refusal = {"error": {"message": "Unsupported parameter: 'max_tokens' is not supported with this model. Use "
                                    "'max_completion_tokens' instead.", "type": "invalid_request_error",
                         "param": "max_tokens", "code": "unsupported_parameter"}}
    with ScriptedServer([Status(400, body=refusal), Reply("one"), Reply("two")]) as srv:
        client = make_client(srv, "openai", max_tokens=99)
        assert client.complete("s", "u").text == "one" and client.complete("s", "u").text == "two"
    bodies = [r["body"] for r in srv.requests]
    assert bodies[0]["max_tokens"] == 99 and "max_tokens" not in bodies[1] and "max_tokens" not in bodies[2]
    assert bodies[1]["max_completion_tokens"] == 99 and bodies[2]["max_completion_tokens"] == 99  # remembered


def test_cost_unknown_without_prices(provider: str) -> None:
    with ScriptedServer([Reply("ok")]) as srv:
        assert make_client(srv, provider, spec_kw={"price_in": 1.0}).complete("s", "u").cost_usd is None


@pytest.mark.parametrize("code", [429, 500, 503])
def test_transient_error_is_retried(provider: str, code: int) -> None:
    with ScriptedServer([Status(code), Reply("second time lucky")]) as srv:
        client = make_client(srv, provider)
        assert client.complete("s", "u").text == "second time lucky"
    assert len(srv.requests) == 2
    assert client.usage.totals()["failures"] == 0


def test_server_error_every_time(provider: str) -> None:
    with ScriptedServer([Status(500)] * 10) as srv:
        client = make_client(srv, provider, max_retries=2)
        err = expect_error(client)
    assert (err.kind, err.model, err.status) == ("server", "test-model", 500)
    assert len(srv.requests) == 3  # max_retries + 1
    assert client.usage.totals()["failure_kinds"] == {"server": 1}


def test_rate_limit_every_time(provider: str) -> None:
    with ScriptedServer([Status(429)] * 10) as srv:
        err = expect_error(make_client(srv, provider, max_retries=1))
    assert err.kind == "rate_limit" and len(srv.requests) == 2


def test_hanging_server_times_out(provider: str) -> None:
    with ScriptedServer([Hang(60)]) as srv:
        client = make_client(srv, provider, timeout_s=0.5, max_retries=0)
        start = time.monotonic()
        err = expect_error(client)
        elapsed = time.monotonic() - start
    assert err.kind == "timeout"
    assert elapsed < 10
    assert len(srv.requests) == 1


def test_empty_reply(provider: str) -> None:
    with ScriptedServer([Reply("  \n")]) as srv:
        client = make_client(srv, provider)
        err = expect_error(client)
    assert err.kind == "empty"
    assert client.usage.totals()["failure_kinds"] == {"empty": 1}


@pytest.mark.parametrize("code, kind", [(400, "bad_request"), (401, "auth"), (403, "auth"), (404, "bad_request"),
                                        (422, "bad_request")])
def test_status_kinds(provider: str, code: int, kind: str) -> None:
    with ScriptedServer([Status(code)] * 3) as srv:
        err = expect_error(make_client(srv, provider))
    assert (err.kind, err.status) == (kind, code)
    assert len(srv.requests) == 1  # client errors are not retried


def test_connection_refused(provider: str) -> None:
    with socket.socket() as s:  # a port that was free a moment ago; nothing listens on it now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}" + ("/v1" if provider == "openai" else "")
    client = LLMClient(LLMSettings((ModelSpec("m", provider, url, KEY_VAR),), timeout_s=2.0, max_retries=0))
    assert expect_error(client).kind == "connection"


# --- keys ---------------------------------------------------------------------------------------------------------

def test_key_reaches_server_and_nowhere_else(provider: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    for name in ("openai", "anthropic", "httpx2", "httpcore2", "httpx", "httpcore", "kernelevolve"):
        caplog.set_level(logging.DEBUG, logger=name)
    echo = {"error": {"message": f"invalid key {SECRET}", "type": "authentication_error"}}
    with ScriptedServer([Reply("ok"), Status(401, body=echo), Status(500), Status(500)]) as srv:
        client = make_client(srv, provider, max_retries=1)
        client.complete("s", "u")
        errors = [expect_error(client), expect_error(client)]
    assert [sent_key(r) for r in srv.requests] == [SECRET] * 4
    assert [e.kind for e in errors] == ["auth", "server"]
    for err in errors:
        assert SECRET not in str(err) and SECRET not in repr(err) and SECRET not in err.detail
        assert err.__cause__ is None and err.__context__ is None  # the SDK error holds the request, headers and all
    assert "***" in str(errors[0])
    assert caplog.records and not [r for r in caplog.records if SECRET in r.getMessage()]
    assert SECRET not in caplog.text
    settings = client.settings
    for text in (json.dumps(settings.to_dict()), repr(settings), repr(settings.models[0]), repr(client),
                 str(client.usage.totals())):
        assert SECRET not in text
    assert KEY_VAR in json.dumps(settings.to_dict())


def test_missing_key_variable(provider: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_VAR)
    with ScriptedServer([Reply("never sent")]) as srv:
        client = make_client(srv, provider)
        err = expect_error(client)
    assert err.kind == "missing_key" and KEY_VAR in str(err)
    assert srv.requests == []
    assert client.usage.totals()["failure_kinds"] == {"missing_key": 1}


def test_default_key_variable(provider: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEFAULT_VARS[provider], "sk-default-var")
    with ScriptedServer([Reply("ok")]) as srv:
        make_client(srv, provider, key_env=None).complete("s", "u")
    assert sent_key(srv.requests[0]) == "sk-default-var"


def test_local_server_needs_no_key(provider: str) -> None:
    with ScriptedServer([Reply("ok")]) as srv:
        assert make_client(srv, provider, key_env=None).complete("s", "u").text == "ok"
    assert sent_key(srv.requests[0]) == "unused"


def test_no_key_and_no_base_url(provider: str) -> None:
    client = LLMClient(LLMSettings((ModelSpec("m", provider),)))
    err = expect_error(client)
    assert err.kind == "missing_key" and DEFAULT_VARS[provider] in str(err)


# --- without the SDKs ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_missing_sdk(sdk: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, sdk, None)  # makes `import sdk` raise ImportError
    client = LLMClient(LLMSettings((ModelSpec("m", sdk, "http://127.0.0.1:9", KEY_VAR),)))
    err = expect_error(client)
    assert err.kind == "missing_sdk" and f"pip install {sdk}" in str(err)


def test_imports_without_sdks() -> None:
    code = ("import sys; sys.modules['openai'] = sys.modules['anthropic'] = None\n"
            "from kernelevolve.propose.providers import LLMClient, LLMSettings, ModelSpec\n"
            "LLMClient(LLMSettings((ModelSpec('m'),)))\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# --- model lists, picking, concurrency, usage ---------------------------------------------------------------------

def test_parse_models() -> None:
    assert parse_models("gpt-4o") == (ModelSpec("gpt-4o"),)
    specs = parse_models(" gpt-4o=2, qwen2.5-coder:32b=1 ,meta-llama/Llama-3.1-8B-Instruct, x=0.5",
                         provider="anthropic", base_url="http://h:1", key_env="K")
    assert [(s.name, s.weight) for s in specs] == [("gpt-4o", 2.0), ("qwen2.5-coder:32b", 1.0),
                                                   ("meta-llama/Llama-3.1-8B-Instruct", 1.0), ("x", 0.5)]
    assert {(s.provider, s.base_url, s.key_env) for s in specs} == {("anthropic", "http://h:1", "K")}


@pytest.mark.parametrize("text, match", [("", "no model"), (" , ", "no model"), ("a,,b", "empty model name"),
                                         ("=2", "empty model name"), ("a=x", "not a number"), ("a=", "not a number"),
                                         ("a=0", "positive"), ("a=-1", "positive"), ("a=nan", "positive"),
                                         ("a=inf", "positive")])
def test_parse_models_errors(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_models(text)


def test_pick_is_weighted_and_seeded() -> None:
    settings = LLMSettings(parse_models("big=3,small=1"))
    client = LLMClient(settings, seed=7)
    picks = [client.pick().name for _ in range(4000)]
    assert 0.72 < picks.count("big") / len(picks) < 0.78
    again = LLMClient(settings, seed=7)
    assert [again.pick().name for _ in range(4000)] == picks
    assert {LLMClient(LLMSettings(parse_models("only"))).pick().name for _ in range(20)} == {"only"}


def test_concurrency_limit() -> None:
    pytest.importorskip("openai")
    with ScriptedServer([Hang(0.3, then=Reply(f"reply {i}")) for i in range(6)]) as srv:
        client = make_client(srv, "openai", concurrency=2)
        with ThreadPoolExecutor(6) as pool:
            done = list(pool.map(lambda i: client.complete("s", f"u{i}"), range(6)))
    assert sorted(c.text for c in done) == [f"reply {i}" for i in range(6)]
    assert len(srv.requests) == 6
    assert srv.max_in_flight == 2


def test_usage_across_models() -> None:
    pytest.importorskip("openai")
    with ScriptedServer([Reply("a", 100, 10), Reply("b", 50, 5), Reply("c", 1000, 100), Status(400)]) as srv:
        priced = ModelSpec("priced", base_url=srv.openai_base_url, key_env=KEY_VAR, price_in=3.0, price_out=15.0)
        free = ModelSpec("free", base_url=srv.openai_base_url, key_env=KEY_VAR)
        client = LLMClient(LLMSettings((priced, free), max_retries=0))
        for spec in (priced, free, priced):
            client.complete("s", "u", spec)
        expect_error(client, free)
    totals = client.usage.totals()
    cost = (1100 * 3.0 + 110 * 15.0) / 1e6
    assert {k: totals[k] for k in ("calls", "failures", "input_tokens", "output_tokens")} == \
        {"calls": 3, "failures": 1, "input_tokens": 1150, "output_tokens": 115}
    assert totals["cost_usd"] == pytest.approx(cost)
    assert totals["by_model"]["priced"]["cost_usd"] == pytest.approx(cost)
    assert totals["by_model"]["free"] == {"calls": 1, "failures": 1, "input_tokens": 50, "output_tokens": 5,
                                          "cost_usd": None, "failure_kinds": {"bad_request": 1}}
    assert [r["body"]["model"] for r in srv.requests] == ["priced", "free", "priced", "free"]


def test_usage_meter_is_thread_safe() -> None:
    meter = UsageMeter()
    assert meter.totals()["cost_usd"] is None and meter.totals()["by_model"] == {}
    done = Completion("x", "m", input_tokens=2, output_tokens=1, cost_usd=None, latency_s=0.0)

    def work() -> None:
        for _ in range(500):
            meter.add(done)
            meter.add_failure("m", "timeout")

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    totals = meter.totals()
    assert (totals["calls"], totals["failures"], totals["input_tokens"], totals["cost_usd"]) == (4000, 4000, 8000, None)


def test_llm_error_pickles() -> None:
    err = pickle.loads(pickle.dumps(LLMError("rate_limit", "m", "slow down", 429)))
    assert (err.kind, err.model, err.status, str(err)) == ("rate_limit", "m", 429, "m: rate_limit: slow down")


# --- config -------------------------------------------------------------------------------------------------------

def test_llm_config_round_trip(tmp_path) -> None:
    settings = LLMSettings((ModelSpec("gpt-4o", weight=2.0, price_in=2.5, price_out=10.0),
                            ModelSpec("claude-x", "anthropic", key_env="MY_KEY"),
                            ModelSpec("qwen2.5-coder:32b", base_url="http://localhost:11434/v1")),
                           timeout_s=30.0, max_retries=1, concurrency=8, max_tokens=4096, temperature=0.7)
    path = tmp_path / "llm.json"
    path.write_text(json.dumps(settings.to_dict()))
    assert load_llm_config(path) == settings
    path.write_text(json.dumps({"models": [{"name": "m"}]}))
    assert load_llm_config(str(path)) == LLMSettings((ModelSpec("m"),))


@pytest.mark.parametrize("content, match", [
    (None, "cannot read"),
    ("{not json", "not valid JSON"),
    ("[]", "JSON object"),
    ('{"models": []}', "non-empty"),
    ('{"models": [{"name": "m"}], "timeout": 3}', "unknown key.*timeout"),
    ('{"models": [{"name": "m", "api_key": "sk-x"}]}', "unknown key.*api_key"),
    ('{"models": [{"weight": 2}]}', "no 'name'"),
    ('{"models": ["m"]}', "must be an object"),
    ('{"models": [{"name": "m", "weight": -1}]}', "weight"),
    ('{"models": [{"name": "m", "provider": "azure"}]}', "provider"),
    ('{"models": [{"name": "m"}], "concurrency": 0}', "concurrency"),
    ('{"models": [{"name": "m"}], "max_retries": "3"}', "max_retries"),
])
def test_llm_config_errors(tmp_path, content: str | None, match: str) -> None:
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=match) as info:
        load_llm_config(path)
    assert str(path) in str(info.value)
