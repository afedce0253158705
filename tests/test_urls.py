"""Lists of servers' URLs (`warden.urls`): what `WARDEN_URL` and `--url` take, what they refuse
(naming the entry and the value), and the order servers are tried in."""

from __future__ import annotations

import pytest

from warden.urls import BadServerUrl, ServerList, parse_urls, unreachable


@pytest.mark.parametrize(
    "value, urls",
    [
        ("http://127.0.0.1:8765", ("http://127.0.0.1:8765",)),
        ("http://a:1,http://b:2", ("http://a:1", "http://b:2")),
        (" http://a:1/ , https://b/warden/ ", ("http://a:1", "https://b/warden")),
        ("http://a:1,http://a:1/,http://b", ("http://a:1", "http://b")),
        ("HTTPS://Head.Example:443", ("HTTPS://Head.Example:443",)),
        ("http://[::1]:8765", ("http://[::1]:8765",)),
    ],
)
def test_one_url_or_several_separated_by_commas(value: str, urls: tuple[str, ...]) -> None:
    assert parse_urls(value) == urls


@pytest.mark.parametrize(
    "value, words",
    [
        ("", ["WARDEN_URL: '' is empty"]),
        ("http://a,,http://b", ["entry 2 of 'http://a,,http://b' is empty"]),
        ("http://a,", ["entry 2 of 'http://a,' is empty"]),
        (",http://a", ["entry 1 of ',http://a' is empty"]),
        ("ftp://files", ["'ftp://files' is not an http:// or https:// URL"]),
        ("http://a,ftp://b", ["'ftp://b' (entry 2 of 'http://a,ftp://b') is not an http:// or https:// URL"]),
        ("head:8765", ["'head:8765' is not an http:// or https:// URL"]),
        ("garbage", ["'garbage' is not an http:// or https:// URL"]),
        ("http://", ["'http://' names no host"]),
        ("http://:8765", ["names no host"]),
        ("http://a b:1", ["'http://a b:1' holds a space or a control character"]),
        ("http://a\x00b", ["holds a space or a control character"]),
        ("http://head:port", ["'http://head:port' is not a URL", "Port"]),
        ("http://head:99999", ["'http://head:99999' is not a URL", "out of range"]),
        ("http://head:0", ["'http://head:0' has port 0"]),
        ("http://head?x=1", ["has a query or a fragment"]),
        ("http://head#top", ["has a query or a fragment"]),
    ],
)
def test_a_bad_entry_is_refused_naming_it_and_the_value(value: str, words: list[str]) -> None:
    with pytest.raises(BadServerUrl) as refused:
        parse_urls(value)
    message = str(refused.value)
    assert message.startswith("WARDEN_URL: ")
    for w in words:
        assert w in message, message


def test_a_password_in_a_url_is_refused_and_never_shown() -> None:
    with pytest.raises(BadServerUrl, match="user name or password") as refused:
        parse_urls("http://a,http://me:s3cret@b:1", "--url")
    message = str(refused.value)
    assert message.startswith("--url: ") and "s3cret" not in message and "me:" not in message
    assert "'http://…@b:1' (entry 2 of 'http://a,http://…@b:1')" in message


def test_servers_are_tried_from_the_one_that_answered_last() -> None:
    servers = ServerList(("http://a", "http://b", "http://c"))
    assert servers.current == "http://a" and servers.in_turn() == ["http://a", "http://b", "http://c"]
    servers.answered("http://b")
    assert servers.current == "http://b" and servers.in_turn() == ["http://b", "http://c", "http://a"]
    servers.answered("http://a")
    assert servers.in_turn() == ["http://a", "http://b", "http://c"]
    with pytest.raises(ValueError):
        ServerList(())


def test_the_message_when_none_answers_names_every_url_and_why() -> None:
    one = unreachable("WARDEN_URL", [("http://a", "connection refused")])
    assert one == "cannot reach the warden server at http://a: connection refused"
    two = unreachable("--url", [("http://a", "connection refused"), ("http://b", "timed out")])
    assert two == "cannot reach any of the 2 warden servers of --url: http://a: connection refused; http://b: timed out"
