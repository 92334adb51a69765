"""What a source run costs over running the same command yourself, measured in one go on this machine.

    python bench/bench_runs.py [--repeats 5] [--input-mib 64]

Baselines, measured in the same run: `python main.py` in a plain subprocess (for a run's round trip)
and hashing the same bytes locally (for moving an input through submit and collect). Prints seconds
and ratios against the baselines.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cortex_nb import Client  # noqa: E402
from tests.backend_process import start_backend  # noqa: E402
from tests.run_projects import write_project  # noqa: E402


def median_seconds(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--input-mib", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-runs-") as folder:
        root = Path(folder)
        backend = start_backend(root / "backend", "--devices", "cpu:2", "--warm-workers", "0")
        try:
            client = Client(backend.url, backend.token)
            project = root / "project"
            spec = write_project(project, "print('hello')", name="bench")

            direct = median_seconds(
                lambda: subprocess.run(
                    [sys.executable, "main.py"], cwd=project, check=True, capture_output=True
                ),
                args.repeats,
            )
            trivial = median_seconds(lambda: client.run(spec).wait(120), args.repeats)
            print(
                f"trivial run: python main.py directly {direct:.3f} s; as a source run (submit -> done) {trivial:.3f} s;"
                f" ratio {trivial / direct:.1f}x"
            )

            data = project / "data.bin"
            data.write_bytes(bytes(range(256)) * (args.input_mib * 4096))
            copy_spec = write_project(
                project,
                "import shutil; shutil.copy('data.bin', 'copy.bin')",
                name="bench-io",
                inputs={"data": {"path": "data.bin"}},
                outputs={"copy": {"path": "copy.bin", "max_bytes": 128 * 2**20}},
            )
            local_hash = median_seconds(lambda: hashlib.sha256(data.read_bytes()).hexdigest(), args.repeats)

            def round_trip() -> None:
                handle = client.run(copy_spec)
                assert handle.wait(300)["status"] == "done", handle.info
                handle.outputs("copy", root / "copy.bin")

            io_seconds = median_seconds(round_trip, max(1, args.repeats // 2))
            mib_s = 2 * args.input_mib / io_seconds
            print(
                f"{args.input_mib} MiB input up, copied, collected and downloaded (verified both ways): {io_seconds:.2f} s"
                f" ({mib_s:.0f} MiB/s moved); local SHA-256 of the same bytes {local_hash:.3f} s;"
                f" ratio {io_seconds / local_hash:.1f}x"
            )
            client.close()
        finally:
            backend.stop()


if __name__ == "__main__":
    main()
