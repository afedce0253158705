"""The CLI refuses a number or duration the API would refuse before it sends anything: one
message naming the option and the value, exit 2 (as a refusal by the server exits)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from warden.cli.main import app

runner = CliRunner()
I32 = 2**31 - 1
SUBMIT = ["submit", "-q", "team"]

# (arguments before `--url`, the option named, the value named)
REFUSED: list[tuple[list[str], str, str]] = [
    *[([*SUBMIT, "-t", v, "--", "true"], "--tier", v) for v in ("0", "-1", "5", str(I32 + 1))],
    *[([*SUBMIT, "-t", "3", "--replicas", v, "--", "true"], "--replicas", v) for v in ("0", "-1", str(I32 + 1))],
    *[
        ([*SUBMIT, "-t", "3", o, v, "--", "true"], o, v)
        for o in ("--gpus", "--cpu", "--memory")
        for v in ("-1", str(I32 + 1))
    ],
    *[([*SUBMIT, "-t", "3", "--gpus", v, "--", "true"], "--gpus", v) for v in ("1.5", "nan")],
    *[
        ([*SUBMIT, "-t", "3", o, v, "--", "true"], o, v)
        for o in ("--lease", "--grace", "--time-limit")
        for v in ("-5m", "nan", "inf", "1e400", "soon", "10", "1.5")
    ],
    *[(["logs", "1", "--attempt", v], "--attempt", v) for v in ("0", "-1", str(I32 + 1))],
    *[(["logs", "1", "--rank", v], "--rank", v) for v in ("-1", str(I32 + 1))],
    *[(["audit", "--limit", v], "--limit", v) for v in ("0", "-1", "10001")],
]


class Listener:
    """A socket standing in for the server: it counts the connections and closes each at once
    (the CLI then fails as for an unreachable server)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()


@pytest.fixture
def server() -> Iterator[Listener]:
    listener = Listener()
    try:
        yield listener
    finally:
        listener.sock.close()


def with_url(args: list[str], url: str) -> list[str]:
    """`args` with `--url` before a submission's `--` (after it, words are the command)."""
    cut = args.index("--") if "--" in args else len(args)
    return [*args[:cut], "--url", url, "--token", "t", *args[cut:]]


@pytest.mark.parametrize(("args", "option", "value"), REFUSED, ids=[" ".join(a) for a, _, _ in REFUSED])
def test_a_bad_number_is_refused_before_anything_is_sent(
    server: Listener, args: list[str], option: str, value: str
) -> None:
    result = runner.invoke(app, with_url(args, server.url))
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.replace("│", " ").split())
    assert option in text and repr(value)[1:-1] in text, text
    assert f"Invalid value for '{option}'" in text or f"error: {option}: {value!r}" in text, text
    assert server.connections == 0, "the CLI sent the request"


def test_numbers_at_their_bounds_are_sent(server: Listener) -> None:
    """The same checks let the bounds through: the request goes out (and finds no server)."""
    args = [*SUBMIT, "-t", "4", "--replicas", "1", "--gpus", "0", "--cpu", str(I32), "--grace", "2m"]
    result = runner.invoke(app, with_url([*args, "--", "true"], server.url))
    assert result.exit_code == 1 and "Invalid value" not in result.output, result.output
    assert server.connections >= 1
    result = runner.invoke(app, with_url(["audit", "--limit", "10000"], server.url))
    assert result.exit_code == 1 and "Invalid value" not in result.output, result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["cancel"], "give the ids of the jobs to cancel, or a selection: --user, --queue or --state"),
        (["cancel", "7", "abc"], "JOB_ID: 'abc' is not a job id"),
        (["cancel", "--state", "SUCCEEDED"], "--state: 'SUCCEEDED' is not a state a job can be cancelled in"),
        (["cancel", "--state", "soon"], "--state: 'SOON' is not a state"),
    ],
)
def test_a_cancel_without_jobs_or_with_a_bad_selection_is_refused_before_anything_is_sent(
    server: Listener, args: list[str], message: str
) -> None:
    result = runner.invoke(app, [*args, "--url", server.url, "--token", "t"])
    assert result.exit_code == 2 and message in result.output, result.output
    assert server.connections == 0, "the CLI sent a request"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--lease", "10", "minutes", "--", "true"], "'minutes' is no option: options go before --, the command after"),
        (["--lease", "10", "--", "true"], "--lease: '10' has no unit: give one, e.g. 600s or 10m"),
        (["true"], "'true' is no option"),
        ([], "no command: give it after --"),
        (["--"], "no command: give it after --"),
    ],
    ids=["a word before --", "a bare number", "no --", "nothing", "nothing after --"],
)
def test_everything_before_dashes_is_options_and_a_duration_has_a_unit(
    server: Listener, args: list[str], message: str
) -> None:
    """`--lease 10 minutes -- true` once submitted `minutes -- true`: a word before `--` that
    is no option is refused, as is a duration without its unit; nothing is sent."""
    result = runner.invoke(app, [*SUBMIT, "-t", "3", "--url", server.url, "--token", "t", *args])
    assert result.exit_code == 2 and message in result.output, result.output
    assert server.connections == 0, "the CLI sent the request"
