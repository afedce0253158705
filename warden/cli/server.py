"""`warden server`: run the control plane — the engine on the real clock, the database, the
HTTP API and the local executor — until interrupted."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal, NoReturn

import typer

from warden.cli.app import duration, fail
from warden.executors import registry
from warden.executors.identity import DEFAULT_JOB_UIDS, parse_uid_range, parse_user_map
from warden.urls import BadServerUrl, parse_urls

if TYPE_CHECKING:
    from warden.engine.policy import PolicyError
    from warden.server.app import Settings


def _bootstrap_token(path: Path | None) -> str | None:
    """The bootstrap token, from the file or else $WARDEN_BOOTSTRAP_TOKEN; never from the
    command line. The variable never stays in this process's environment, not even in the
    block the kernel shows in /proc/PID/environ (`_token_from_environment`)."""
    from_env = _token_from_environment()
    if path is None:
        return from_env
    try:
        token = path.read_text().strip()
    except OSError as err:
        fail(f"--bootstrap-token-file: cannot read {str(path)!r}: {err.strerror or err}")
    if not token:
        fail(f"--bootstrap-token-file: {str(path)!r} is empty")
    return token


HANDED_FD = "WARDEN_BOOTSTRAP_FD"
"""The variable naming the pipe through which this command handed the bootstrap token to
itself across `exec` (`_token_from_environment`)."""

_MOST_TOKEN_BYTES = 4096  # what one write to an empty pipe takes whole (PIPE_BUF)


def _token_from_environment() -> str | None:
    """$WARDEN_BOOTSTRAP_TOKEN, gone from the process. Removing it from `os.environ` leaves it
    in the environment block the process started with, which /proc/PID/environ shows for as
    long as the process lives. So when the variable is set, the command writes the token into
    a pipe and execs itself again (same pid, same arguments, before any thread or server
    starts) with the variable removed and the pipe's read end named by $WARDEN_BOOTSTRAP_FD;
    that start reads the token from the pipe and closes it. Nothing is written to disk."""
    handed = os.environ.pop(HANDED_FD, None)
    token = os.environ.pop("WARDEN_BOOTSTRAP_TOKEN", None)
    if token:
        _exec_without(token)
    if handed is None:
        return token or None
    return _read_handed(handed) or None


def _exec_without(token: str) -> NoReturn:
    data = token.encode()
    if len(data) > _MOST_TOKEN_BYTES:
        fail(f"$WARDEN_BOOTSTRAP_TOKEN: longer than {_MOST_TOKEN_BYTES} bytes")
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, data)
    finally:
        os.close(write_end)
    os.set_inheritable(read_end, True)
    env = {**os.environ, HANDED_FD: str(read_end)}  # `os.environ` no longer holds the token
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def _read_handed(value: str) -> str:
    try:
        fd = int(value)
    except ValueError:
        fail(f"${HANDED_FD}: {value!r} is no file descriptor")
    chunks: list[bytes] = []
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.close(fd)
            fail(f"${HANDED_FD}: file descriptor {fd} is no pipe")
        with os.fdopen(fd, "rb") as pipe:
            while chunk := pipe.read(_MOST_TOKEN_BYTES):
                chunks.append(chunk)
    except OSError as err:
        fail(f"${HANDED_FD}: cannot read file descriptor {fd}: {err.strerror or err}")
    return b"".join(chunks).decode()


def _token_lifetime(text: str) -> float | None:
    """--token-lifetime: a duration (30d, 12h), at most 10 years; 0 or 'never' for none."""
    from warden.server.auth import TOKEN_LIFETIME_MAX_S

    if text.strip().lower() in ("never", "0"):
        return None
    seconds = duration("--token-lifetime", text)
    if seconds == 0:
        return None
    if not 1 <= seconds <= TOKEN_LIFETIME_MAX_S:
        fail(f"--token-lifetime: {text!r} is not between 1s and 3650d (10 years); 'never' for no expiry")
    return seconds


CONFIG_KEYS = (
    "db",
    "policy",
    "host",
    "port",
    "advertise_url",
    "fake_gpus",
    "state_dir",
    "bootstrap_token_file",
    "run_as",
    "job_uids",
    "user_map",
    "executor",
    "slurm_partition",
    "ray_address",
    "ray_trust_unauthenticated",
    "history_interval",
    "forecast_interval",
    "token_lifetime",
    "private_data",
    "tls_cert",
    "tls_key",
    "plain_http",
)
"""What a server config file may set: the options of `warden server`, by their names with '_'."""


def _load_config(ctx: typer.Context, _param: object, path: Path | None) -> Path | None:
    """Read `--config` before every other option, as their defaults: an option given on the
    command line or by its environment variable still wins."""
    if path is None:
        return None
    import yaml

    from warden.engine.safeyaml import describe, load_yaml

    try:
        data = load_yaml(path.read_text())
    except OSError as err:
        fail(f"--config: cannot read {str(path)!r}: {err.strerror or err}")
    except UnicodeDecodeError as err:
        fail(f"--config: cannot read {str(path)!r}: not UTF-8 text ({err.reason} at byte {err.start})")
    except yaml.YAMLError as err:
        fail(f"--config {str(path)!r}: {describe(err)}")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        fail(f"--config: {str(path)!r} must hold a mapping of options, got {type(data).__name__}")
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name not in CONFIG_KEYS:
            fail(f"--config: {key!r} in {str(path)!r} is no option of warden server; allowed: {', '.join(CONFIG_KEYS)}")
        if isinstance(value, dict) or (isinstance(value, list) and name != "user_map"):
            fail(f"--config: {key!r} in {str(path)!r} must be a single value, got {value!r}")
    ctx.default_map = {**(ctx.default_map or {}), **{str(k).replace("-", "_"): v for k, v in data.items()}}
    return path


def register(app: typer.Typer) -> None:
    @app.command("server")
    def server(
        db: Annotated[
            str | None,
            typer.Option(
                "--db",
                envvar="WARDEN_DB",
                help=(
                    "Database URL (default: SQLite in the state directory; postgresql://… for PostgreSQL). "
                    "A URL with a password belongs in $WARDEN_DB: a command line is readable in /proc."
                ),
                show_default=False,
            ),
        ] = None,
        policy: Annotated[
            Path | None,
            typer.Option(
                "--policy", help="Policy YAML applied at start (a new version when it changed).", show_default=False
            ),
        ] = None,
        host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
        port: Annotated[int, typer.Option("--port")] = 8765,
        advertise_url: Annotated[
            str | None,
            typer.Option(
                "--advertise-url",
                help="The URL jobs and the other servers of the database reach this server at (default "
                "https://HOST:PORT of --host, 127.0.0.1 for 0.0.0.0; a TLS proxy's URL with --plain-http behind it): set it when jobs run on other machines.",
                show_default=False,
            ),
        ] = None,
        fake_gpus: Annotated[
            int | None,
            typer.Option("--fake-gpus", help="Pretend this machine has N GPUs (no GPU needed).", show_default=False),
        ] = None,
        state_dir: Annotated[
            Path | None,
            typer.Option(
                "--state-dir",
                help="Logs, checkpoints and the default database (default $WARDEN_STATE_DIR; as root /var/lib/warden, "
                "else ~/.local/state/warden).",
                show_default=False,
            ),
        ] = None,
        bootstrap_token_file: Annotated[
            Path | None,
            typer.Option(
                "--bootstrap-token-file",
                help="Make the token in this file an admin token at start (or set $WARDEN_BOOTSTRAP_TOKEN).",
                show_default=False,
            ),
        ] = None,
        bootstrap_token: Annotated[
            str | None, typer.Option("--bootstrap-token", hidden=True, show_default=False)
        ] = None,
        run_as: Annotated[
            str,
            typer.Option(
                "--run-as",
                help="Who jobs run as (server as root): 'dynamic', a uid of its own per attempt from --job-uids; "
                "'user', the submitting user's Unix account (see --user-map), else a dynamic uid.",
            ),
        ] = "dynamic",
        job_uids: Annotated[
            str,
            typer.Option("--job-uids", help="The uids (and gids) reserved for jobs, LO-HI."),
        ] = f"{DEFAULT_JOB_UIDS.start}-{DEFAULT_JOB_UIDS.stop - 1}",
        user_map: Annotated[
            list[str] | None,
            typer.Option(
                "--user-map",
                help="With --run-as user: WARDEN_USER=ACCOUNT (repeatable; '*=ACCOUNT' for every other user).",
                show_default=False,
            ),
        ] = None,
        executor: Annotated[
            str,
            typer.Option(
                "--executor",
                envvar="WARDEN_EXECUTOR",
                help=f"What runs the jobs: {registry.described()}.",
            ),
        ] = registry.DEFAULT,
        slurm_partition: Annotated[
            str | None,
            typer.Option(
                "--slurm-partition",
                envvar="WARDEN_SLURM_PARTITION",
                help="With --executor slurm: the partition warden governs (default: the cluster's default one).",
                show_default=False,
            ),
        ] = None,
        ray_address: Annotated[
            str | None,
            typer.Option(
                "--ray-address",
                envvar="WARDEN_RAY_ADDRESS",
                help="With --executor ray: the cluster's address, HOST:PORT of its head (required).",
                show_default=False,
            ),
        ] = None,
        ray_trust_unauthenticated: Annotated[
            bool,
            typer.Option(
                "--ray-trust-unauthenticated",
                envvar="WARDEN_RAY_TRUST_UNAUTHENTICATED",
                help=(
                    "With --executor ray: govern a cluster without Ray's token authentication, trusting every "
                    "process that can reach its ports (a job among them can kill any job and run code as the "
                    "cluster's workers). Refused by default."
                ),
            ),
        ] = False,
        history_interval: Annotated[
            float,
            typer.Option(
                "--history-interval",
                help="Seconds between the samples of GET /v1/history (the dashboard's charts), 1 to 86400.",
            ),
        ] = 60.0,
        forecast_interval: Annotated[
            float,
            typer.Option(
                "--forecast-interval",
                help="Seconds between two forecasts of the waiting jobs' expected starts, 1 to 3600.",
            ),
        ] = 10.0,
        token_lifetime: Annotated[
            str,
            typer.Option(
                "--token-lifetime",
                help="How long a token made by 'warden token create' lives unless --expires says: a duration "
                "up to 3650d, or 'never' (or 0). The bootstrap and first admin tokens never expire.",
            ),
        ] = "90d",
        private_data: Annotated[
            str,
            typer.Option(
                "--private-data",
                help="What users may not read of other users' jobs: 'jobs', their command, workdir and logs "
                "(only the owner and admins may); 'none', everything.",
            ),
        ] = "jobs",
        tls_cert: Annotated[
            Path | None,
            typer.Option(
                "--tls-cert",
                help="Serve HTTPS with this certificate (PEM, its chain after it; with --tls-key) instead of the "
                "server's own, which it makes at first start (ca.crt in the state directory; docs/service.md).",
                show_default=False,
            ),
        ] = None,
        tls_key: Annotated[
            Path | None,
            typer.Option("--tls-key", help="The key of --tls-cert (PEM, readable by root only).", show_default=False),
        ] = None,
        plain_http: Annotated[
            bool,
            typer.Option(
                "--plain-http",
                help="Serve plain HTTP, not HTTPS: tokens cross the network in clear, and a process that takes the "
                "port while the server is down receives them. Only behind a proxy that terminates TLS on this machine.",
            ),
        ] = False,
        config: Annotated[
            Path | None,
            typer.Option(
                "--config",
                envvar="WARDEN_CONFIG",
                is_eager=True,
                callback=_load_config,
                help="A YAML file of these options (executor: slurm, port: 9000, ...); the command line wins.",
                show_default=False,
            ),
        ] = None,
    ) -> None:
        """Run the warden server on this machine."""
        from warden.server.app import Settings

        _check_numbers(fake_gpus, bootstrap_token, history_interval, forecast_interval)
        _check_executor(executor, fake_gpus, slurm_partition, ray_address, ray_trust_unauthenticated)
        mode = _run_as(run_as)
        uids, mapping = _job_identities(job_uids, user_map)
        lifetime = _token_lifetime(str(token_lifetime))
        hidden = _private_data(private_data)
        advertised = _advertised(advertise_url)
        _check_tls(tls_cert, tls_key, plain_http, advertised)
        token = _bootstrap_token(bootstrap_token_file)
        if policy is not None:
            _check_policy(policy)
        if state_dir is not None:
            os.environ["WARDEN_STATE_DIR"] = str(state_dir)
        settings = Settings(
            db=db,
            policy=policy,
            host=host,
            port=port,
            advertise_url=advertised,
            fake_gpus=fake_gpus,
            state_dir=state_dir,
            bootstrap_token=token,
            run_as=mode,
            job_uids=uids,
            user_map=mapping,
            executor=executor,
            slurm_partition=slurm_partition,
            ray_address=ray_address,
            ray_trust_unauthenticated=ray_trust_unauthenticated,
            history_interval_s=history_interval,
            forecast_interval_s=forecast_interval,
            token_lifetime_s=lifetime,
            private_data=hidden,
            tls_cert=tls_cert,
            tls_key=tls_key,
            plain_http=plain_http,
        )
        _serve(settings)


# -- what `warden server` checks and runs, in the order it reports refusals -----------------------


def _check_numbers(
    fake_gpus: int | None, bootstrap_token: str | None, history_interval: float, forecast_interval: float
) -> None:
    """--fake-gpus, --history-interval and --forecast-interval in their bounds, and no
    --bootstrap-token (a token on a command line is anyone's to read)."""
    if fake_gpus is not None and fake_gpus < 0:
        fail(f"--fake-gpus: {fake_gpus} must not be negative")
    if bootstrap_token is not None:
        fail(
            "--bootstrap-token: a token on the command line is visible to every user of this machine "
            "(/proc/PID/cmdline); use --bootstrap-token-file PATH or $WARDEN_BOOTSTRAP_TOKEN"
        )
    if not 1.0 <= history_interval <= 86400.0:
        fail(f"--history-interval: {history_interval!r} is not between 1 and 86400 seconds")
    if not 1.0 <= forecast_interval <= 3600.0:
        fail(f"--forecast-interval: {forecast_interval!r} is not between 1 and 3600 seconds")


def _check_executor(
    executor: str,
    fake_gpus: int | None,
    slurm_partition: str | None,
    ray_address: str | None,
    ray_trust_unauthenticated: bool,
) -> None:
    """--executor names a kind, and the options another kind owns are not given with it (the
    registry says which)."""
    refusal = registry.option_refusal(
        executor,
        {
            "fake_gpus": fake_gpus,
            "slurm_partition": slurm_partition,
            "ray_address": ray_address,
            "ray_trust_unauthenticated": ray_trust_unauthenticated,
        },
    )
    if refusal is not None:
        fail(refusal)


def _run_as(text: str) -> Literal["dynamic", "user"]:
    """--run-as: 'dynamic' or 'user'."""
    if text == "dynamic":
        return "dynamic"
    if text == "user":
        return "user"
    fail(f"--run-as: expected 'dynamic' or 'user', got {text!r}")


def _job_identities(job_uids: str, user_map: list[str] | None) -> tuple[range, tuple[tuple[str, str], ...]]:
    """--job-uids as a range and --user-map as (warden user, Unix account) pairs."""
    try:
        return parse_uid_range(job_uids), tuple(parse_user_map(user_map or ()).items())
    except ValueError as err:
        fail(str(err))


def _private_data(text: str) -> Literal["jobs", "none"]:
    """--private-data: 'jobs' or 'none'."""
    if text == "jobs":
        return "jobs"
    if text == "none":
        return "none"
    fail(f"--private-data: expected 'jobs' or 'none', got {text!r}")


def _advertised(text: str | None) -> str | None:
    """--advertise-url: one server URL, as `parse_urls` writes it; None when not given."""
    if text is None:
        return None
    try:
        [url] = parse_urls(text, "--advertise-url")
    except BadServerUrl as err:
        fail(str(err))
    except ValueError:
        fail(f"--advertise-url: {text!r} names several URLs; give this server's one")
    return url


def _check_tls(tls_cert: Path | None, tls_key: Path | None, plain_http: bool, advertise_url: str | None) -> None:
    """--tls-cert and --tls-key both or neither, neither with --plain-http, and an https://
    --advertise-url unless the server serves plain HTTP."""
    if (tls_cert is None) != (tls_key is None):
        given, missing = ("--tls-cert", "--tls-key") if tls_cert is not None else ("--tls-key", "--tls-cert")
        fail(f"{missing}: {given} was given without it; give both, or neither for the server's own certificate")
    if plain_http and tls_cert is not None:
        fail(f"--plain-http: given with --tls-cert {str(tls_cert)!r}; choose one")
    if not plain_http and advertise_url is not None and advertise_url.startswith("http://"):
        fail(
            f"--advertise-url: {advertise_url!r} is http://, but the server serves HTTPS (https://…; "
            "--plain-http for plain HTTP)"
        )


def _policy_refused(policy: Path | None, err: PolicyError) -> NoReturn:
    """Each issue of a refused policy file on its own line of stderr, then exit 2."""
    for issue in err.issues:
        typer.echo(f"{policy}: {issue}", err=True)
    raise typer.Exit(2) from None


def _check_policy(policy: Path) -> None:
    """--policy: a refused file is reported before anything is made."""
    from warden.engine.policy import PolicyError, load_policy

    try:
        load_policy(policy)
    except PolicyError as err:
        _policy_refused(policy, err)


def _serve(settings: Settings) -> None:
    """Run the server until it is interrupted; what stops it from starting is reported as a
    refusal of the option it comes from (exit 2)."""
    from warden.engine.policy import PolicyError
    from warden.server.app import serve
    from warden.server.listen import CannotListen
    from warden.server.statedir import StateDirError
    from warden.server.tls import TlsError

    errors = registry.kind(settings.executor).errors()  # what the executor's factory raises when it cannot build it
    try:
        serve(settings, say=lambda line: typer.echo(line, err=True))
    except PolicyError as err:
        _policy_refused(settings.policy, err)
    except errors as err:
        fail(f"--executor {settings.executor}: {err}")
    except (StateDirError, CannotListen, TlsError) as err:
        fail(str(err))
