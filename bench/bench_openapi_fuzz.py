"""schemathesis against a live backend for longer than CI allows (tests/test_openapi_fuzz.py is the CI run).

    python bench/bench_openapi_fuzz.py [--seconds 240] [--seed 1] [--workers 1]

Prints the requests sent, their statuses, the operations covered and the failures by kind (checks:
not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance),
then checks the backend is alive and logged no unhandled exception. Exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from cortex_nb.protocol import routes  # noqa: E402
from tests.backend_process import start_backend  # noqa: E402
from tests.fuzz_report import fuzz  # noqa: E402
from tests.tokens import create_token  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=240)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    os.environ.setdefault("CORTEX_STRICT_REPLIES", "1")
    os.environ.setdefault("CORTEX_DISABLE_TELEMETRY", "1")
    with tempfile.TemporaryDirectory(prefix="cortex-fuzz-") as tmp:
        backend = start_backend(Path(tmp) / "backend", "--devices", "cpu:2", "--worker-threads", "1")
        try:
            token = create_token(backend.data_dir, "fuzzer", "jobs:read", "jobs:write", "runs:write")
            started = time.perf_counter()
            report = fuzz(backend.url, token, Path(tmp), args.seconds, seed=args.seed, workers=args.workers)
            wall = time.perf_counter() - started
            alive = (
                httpx.get(
                    f"{backend.url}/v1/capacity", headers={"Authorization": f"Bearer {token}"}, timeout=30
                ).status_code
                == 200
            )
            unhandled = backend.log().count("Uncaught exception") + backend.log().count(
                "Exception in callback"
            )
        finally:
            backend.stop()
    print(f"requests sent:        {report.requests} in {wall:.0f} s ({report.requests / wall:.0f}/s)")
    print(f"statuses:             {dict(sorted(report.statuses.items(), key=lambda item: str(item[0])))}")
    print(f"operations covered:   {len(report.operations)} of {len(routes.ROUTES)}")
    print(f"failures by check:    {dict(report.failures) or 'none'}")
    print(f"errors (incl. hangs): {len(report.errors)}")
    print(f"5xx answers:          {report.server_errors}")
    print(f"backend alive after:  {alive}; unhandled exceptions logged: {unhandled}")
    ok = alive and not unhandled and not report.failures and not report.errors and report.server_errors == 0
    if not ok:
        print(report.output)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
