"""What the client's API layer costs per call: checking a reply against its route's model (the cheap
default check and the full strict one), in microseconds per reply, on real replies of a real backend; and
a no-op request's round trip through the layer against the same calls sent straight through the transport
(what client.py did before the layer existed), alternated in one run. With `--before REF` it also runs
the same `client.poll_request(job, client.noop(job))` with the client of an earlier tree and with this
one, call by call alternated against the same backend.

    python bench/bench_api_layer.py [--repeats 300] [--before main]

The goal: the default check is a negligible part of a round trip, and the ratio layer/direct stays ~1.0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cortex_nb import Client  # noqa: E402
from cortex_nb.api import check_reply  # noqa: E402
from cortex_nb.protocol.routes import route  # noqa: E402
from cortex_nb.protocol.states import REQUEST_TERMINAL  # noqa: E402
from tests.backend_process import start_backend  # noqa: E402


def per_call_us(function, number: int) -> float:
    """Median of 5 runs of `number` calls, in microseconds per call."""
    return min(timeit.repeat(function, number=number, repeat=5)) / number * 1e6


def direct_noop(client: Client, job_id: str) -> None:
    """A no-op submitted and awaited with the transport alone (no route table lookup, no reply check)."""
    transport = client.transport
    submitted = transport.json("POST", f"/v1/jobs/{job_id}/noop", json={})
    request_id = submitted["request_id"]
    while True:
        status = transport.json(
            "GET",
            f"/v1/jobs/{job_id}/requests/{request_id}",
            params={"cursor": 0, "wait": 25.0},
            timeout_s=55,
        )
        if status["status"] in REQUEST_TERMINAL:
            return


def checkout(ref: str, into: Path) -> Path:
    """`cortex_nb` of `ref`, unpacked under `into` as the package `cortex_nb_before` (its imports are
    relative, so both trees' clients load side by side in this process)."""
    archive = into / "tree.tar"
    subprocess.run(
        ["git", "archive", "--format=tar", "-o", str(archive), ref, "cortex_nb"], cwd=ROOT, check=True
    )
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    (into / "tree" / "cortex_nb").rename(into / "tree" / "cortex_nb_before")
    return into / "tree"


def compare_clients(ref: str, tmp: Path, url: str, token: str, job_id: str, repeats: int) -> None:
    """The same `poll_request(job, noop(job))` with `ref`'s client and this tree's, call by call alternated."""
    sys.path.insert(0, str(checkout(ref, tmp)))
    from cortex_nb_before import Client as BeforeClient

    times: dict[str, list[float]] = {"before": [], "after": []}
    with BeforeClient(url, token) as before, Client(url, token) as after:
        for _ in range(repeats):
            for name, client in (("before", before), ("after", after)):
                started = time.perf_counter()
                client.poll_request(job_id, client.noop(job_id))
                times[name].append(time.perf_counter() - started)
    old, new = (statistics.median(times[name]) * 1000 for name in ("before", "after"))
    print(
        f"{'no-op round trip (ms): client ' + ref + ' / this':46s} {old:8.3f} {new:8.3f}  ratio this/{ref} {new / old:.3f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--before", help="git ref of a tree whose client to compare with (e.g. main)")
    args = parser.parse_args()
    os.environ.setdefault("CORTEX_DISABLE_TELEMETRY", "1")
    os.environ["CORTEX_STRICT_REPLIES"] = "0"
    with tempfile.TemporaryDirectory(prefix="cortex-api-layer-") as tmp:
        backend = start_backend(Path(tmp) / "backend", "--devices", "cpu:1", "--worker-threads", "1")
        try:
            with Client(backend.url, backend.token) as client:
                job_id = client.create_job([{"type": "sampling", "base_model": "tiny"}])["job_id"]
                client.poll_request(job_id, client.noop(job_id), timeout_s=300)  # the worker is up
                submitted = client.api.noop(job_id)
                replies = {
                    "noop": submitted,
                    "get_request": client.api.get_request(job_id, submitted["request_id"], wait_s=10),
                    "get_job": client.api.get_job(job_id),
                    "list_jobs": client.api.list_jobs(limit=50),
                }
                print(f"{'reply checked against its model (us)':46s} {'default':>8s} {'strict':>8s}")
                for name, reply in replies.items():
                    spec = route(name)
                    cheap = per_call_us(lambda s=spec, r=reply: check_reply(s, r), 20_000)
                    full = per_call_us(lambda s=spec, r=reply: check_reply(s, r, strict=True), 2_000)
                    print(f"  {name + ' (' + spec.reply.__name__ + ')':44s} {cheap:8.2f} {full:8.2f}")
                layered: list[float] = []
                direct: list[float] = []
                for _ in range(args.repeats):
                    started = time.perf_counter()
                    client.poll_request(job_id, client.noop(job_id))
                    layered.append(time.perf_counter() - started)
                    started = time.perf_counter()
                    direct_noop(client, job_id)
                    direct.append(time.perf_counter() - started)
                if args.before:
                    compare_clients(args.before, Path(tmp), backend.url, backend.token, job_id, args.repeats)
                client.cancel_job(job_id)
        finally:
            backend.stop()
    through, straight = statistics.median(layered) * 1000, statistics.median(direct) * 1000
    print(
        f"{'no-op round trip (ms): api layer / transport':46s} {through:8.3f} {straight:8.3f}"
        f"  ratio {through / straight:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
