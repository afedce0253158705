"""The CLI's client with several servers' URLs (`warden.client`), against stand-ins: a server
that cannot be reached is passed over and the one that answered is kept for the process; an
HTTP answer, whatever its status, is never sent to another server; a bad list is refused
before anything is sent."""

from __future__ import annotations

import pytest
from fakeapi import fake_apis
from pg import free_port

from warden.client import ApiRefused, BadServerUrl, Client, Unreachable


def nowhere() -> str:
    return f"http://127.0.0.1:{free_port()}"


def test_a_server_that_refuses_connections_is_passed_over_and_the_next_kept() -> None:
    dead = nowhere()
    with fake_apis((200, [{"id": "1"}]), (200, [])) as (first, second):
        urls = f"{dead},{first.url},{second.url}"
        c = Client(urls, "t")
        assert c.url == dead
        assert c.jobs() == [{"id": "1"}]
        assert c.url == first.url and Client(urls, "t").url == first.url  # the process remembers
        assert c.job("1") == [{"id": "1"}] and first.requests == [("GET", "/v1/jobs"), ("GET", "/v1/jobs/1")]
        first.close()
        assert c.jobs() == [] and c.url == second.url  # the remembered one died: the next
        assert Client(urls, "t").url == second.url
        c.close()


@pytest.mark.parametrize("status", [401, 404, 409, 500, 503])
def test_an_http_answer_of_any_status_is_the_answer(status: int) -> None:
    error = {"error": {"field": "id", "value": "1", "message": "no"}}
    with fake_apis((status, error), (200, {"id": "1", "state": "PENDING"})) as (first, second):
        c = Client(f"{first.url},{second.url}", "t")
        with pytest.raises(ApiRefused) as refused:
            c.submit(idempotency_key="k", retries=2, queue="q")
        assert refused.value.status == status
        with pytest.raises(ApiRefused):
            c.job("1")
        assert second.requests == [] and len(first.requests) == 2
        c.close()


def test_when_none_answers_the_error_names_every_url() -> None:
    urls = [nowhere(), nowhere()]
    c = Client(",".join(urls), "t")
    with pytest.raises(Unreachable) as gone:
        c.jobs()
    message = str(gone.value)
    assert message.startswith("cannot reach any of the 2 warden servers of --url: ")
    assert all(f"{u}: " in message for u in urls), message
    c.close()


def test_warden_url_is_the_default_and_a_bad_one_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARDEN_URL", "https://a:1, https://b:2/")
    assert Client(token="t").servers.urls == ("https://a:1", "https://b:2")
    monkeypatch.setenv("WARDEN_URL", "https://a:1,,https://b:2")
    with pytest.raises(BadServerUrl, match=r"^WARDEN_URL: entry 2 of 'https://a:1,,https://b:2' is empty$"):
        Client(token="t")
    with pytest.raises(BadServerUrl, match=r"^--url: 'tcp://a' is not an http"):
        Client("tcp://a", "t")


@pytest.mark.parametrize("url", ["http://head:8765", "http://10.0.0.7:8765", "https://head:8765,http://[fd00::1]:1"])
def test_a_token_is_never_sent_in_clear_to_another_machine(url: str) -> None:
    with pytest.raises(BadServerUrl, match=r"is plain HTTP to another machine: a token is never sent there in clear"):
        Client(url, "t")
    assert Client(url, None).token is None  # without a token there is nothing to keep from it


@pytest.mark.parametrize("url", ["http://127.0.0.1:8765", "http://127.1.2.3:1", "http://[::1]:1", "http://localhost:1"])
def test_plain_http_to_this_machine_may_carry_a_token(url: str) -> None:
    assert Client(url, "t").token == "t"
