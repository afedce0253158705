"""The workload SDK benchmark: what the SDK costs a training job, one JSON object on stdout.

    python bench/sdk.py [--quick] [--runs K]

- `should_stop_ns`: `if guard.should_stop(): pass` with no signal, per execution: the median
  over K runs of 10^6 executions in timeit's loop; `empty_loop_ns` the same loop running
  `pass`, the part that is not the guard's. Target: well under 1 µs.
- `progress_*_ns`: `Reporter.progress()` per call, outside warden (disabled) and inside it
  between two sends (rate-limited), against a local HTTP server.
- `sigterm_to_exit_s`: SIGTERM (to the process group, as the executor sends it) to process
  exit for examples/train_torch.py and examples/train_plain.py, each reporting to a local HTTP
  server: finishing the current step (steps of 20 ms), the save with its fsyncs and its two
  synchronous reports, the flush, and interpreter shutdown. Median over K runs, and the max;
  `sigterm_to_saved_s` is the part until the example printed that its checkpoint is saved.
- `save_10mb_ms`: `CheckpointStore.save` of 10 MB of bytes (write, fsync, sidecar, two renames,
  two directory fsyncs), median over K×2 saves, in a temporary directory (so on the disk that
  holds $TMPDIR); `save_torch_10mb_ms` the same for a 10 MB tensor state dict;
  `load_latest_10mb_ms` reading and verifying (SHA-256) the 10 MB checkpoint.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import timeit
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    sys.path.insert(0, str(REPO))

from warden.workload import CheckpointStore, PreemptionGuard, Reporter  # noqa: E402


class _Sink(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def start_sink() -> tuple[http.server.ThreadingHTTPServer, str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def per_call_ns(stmt: str, runs: int, number: int = 1_000_000, **names: Any) -> float:
    """Median over `runs` of `number` executions of `stmt`, per execution, in ns."""
    timer = timeit.Timer(stmt, globals=names)
    return statistics.median(timer.repeat(number=number, repeat=runs)) / number * 1e9


def bench_calls(runs: int, url: str) -> dict[str, float]:
    before = signal.getsignal(signal.SIGTERM)
    guard = PreemptionGuard(env={}).install()
    try:
        # What a training loop runs each step: an attribute lookup, a call, a test.
        should_stop = per_call_ns("if guard.should_stop(): pass", runs, guard=guard)
    finally:
        guard.uninstall()
        signal.signal(signal.SIGTERM, before)
    empty = per_call_ns("pass", runs)
    disabled = Reporter.from_env({})
    enabled = Reporter.from_env({"WARDEN_URL": url, "WARDEN_JOB_ID": "bench"}, min_interval=3600)
    enabled.progress(0)  # the first call sends; the rest fall in the rate limit
    enabled.flush(5)
    return {
        "should_stop_ns": round(should_stop, 1),
        "empty_loop_ns": round(empty, 1),
        "progress_disabled_ns": round(per_call_ns("r.progress(1)", runs, r=disabled), 1),
        "progress_rate_limited_ns": round(per_call_ns("r.progress(1)", runs, r=enabled), 1),
    }


def sigterm_to_exit(script: str, args: list[str], url: str) -> tuple[float, float]:
    """One run: start the example, wait for its third step, SIGTERM its group; the seconds
    until it printed that its checkpoint was saved, and until it exited."""
    with tempfile.TemporaryDirectory() as ckpt:
        env = {k: v for k, v in os.environ.items() if not k.startswith("WARDEN_")}
        env.update(
            {
                "WARDEN_JOB_ID": "bench",
                "WARDEN_ATTEMPT": "1",
                "WARDEN_URL": url,
                "WARDEN_GRACE_SECONDS": "30",
                "WARDEN_CHECKPOINT_DIR": ckpt,
            }
        )
        proc = subprocess.Popen(
            [sys.executable, str(REPO / "examples" / script), *args],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("step 3 "):
                break
        sent = time.perf_counter()
        os.killpg(proc.pid, signal.SIGTERM)
        saved = None
        for line in proc.stdout:
            if line.startswith("SIGTERM: saved"):
                saved = time.perf_counter() - sent
        rc = proc.wait(60)
        took = time.perf_counter() - sent
        if rc != 0 or saved is None:
            raise RuntimeError(f"{script} exited {rc} after SIGTERM (saved: {saved})")
        return saved, took


def bench_exits(runs: int, url: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    args = ["--steps", "100000", "--step-seconds", "0.02", "--checkpoint-every", "0"]
    for name, script in (("train_torch", "train_torch.py"), ("train_plain", "train_plain.py")):
        if name == "train_torch":
            try:
                import torch  # noqa: F401
            except ImportError:
                out[f"sigterm_to_exit_s_{name}"] = None
                continue
        pairs = [sigterm_to_exit(script, args, url) for _ in range(runs)]
        exits = [took for _, took in pairs]
        out[f"sigterm_to_saved_s_{name}"] = round(statistics.median(s for s, _ in pairs), 4)
        out[f"sigterm_to_exit_s_{name}"] = round(statistics.median(exits), 4)
        out[f"sigterm_to_exit_s_{name}_max"] = round(max(exits), 4)
    return out


def bench_saves(runs: int) -> dict[str, Any]:
    quiet = Reporter.from_env({})
    payload = os.urandom(10 * 1024 * 1024)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        store = CheckpointStore(d, keep=2, reporter=quiet)
        times = []
        for step in range(runs * 2):
            t = time.perf_counter()
            store.save(step, payload)
            times.append(time.perf_counter() - t)
        out["save_10mb_ms"] = round(statistics.median(times) * 1e3, 2)
        loads = []
        for _ in range(runs):
            t = time.perf_counter()
            store.load_latest()
            loads.append(time.perf_counter() - t)
        out["load_latest_10mb_ms"] = round(statistics.median(loads) * 1e3, 2)
    try:
        import torch
    except ImportError:
        out["save_torch_10mb_ms"] = None
        return out
    with tempfile.TemporaryDirectory() as d:
        store = CheckpointStore(d, keep=2, reporter=quiet)
        state = {"weight": torch.randn(10 * 1024 * 1024 // 4)}
        times = []
        for step in range(runs * 2):
            t = time.perf_counter()
            store.save_torch(step, state)
            times.append(time.perf_counter() - t)
        out["save_torch_10mb_ms"] = round(statistics.median(times) * 1e3, 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="3 runs, for a smoke test")
    args = parser.parse_args()
    runs = 3 if args.quick else args.runs
    server, url = start_sink()
    try:
        result: dict[str, Any] = {"runs": runs, "python": platform.python_version(), "cpus": os.cpu_count()}
        result.update(bench_calls(runs, url))
        result.update(bench_saves(runs))
        result.update(bench_exits(runs, url))
    finally:
        server.shutdown()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
