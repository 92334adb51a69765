"""What typing the service<->worker messages costs, per message, three ways: the project's frozen dataclasses
(worker_messages.py), the same records as pydantic models, and as msgspec structs (where msgspec is
installed: the vLLM venv has it), against untyped dicts (what they were before). Each way encodes a `request` and decodes a `finished` header the size a
no-op round trip sends, through JSON, as ipc.py does; medians of alternating runs.

    python bench/bench_worker_messages.py [--repeats 20000]
    .venv-vllm/bin/python bench/bench_worker_messages.py      # with msgspec
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "backend")]

from cortex_backend import worker_messages as messages  # noqa: E402
from pydantic import BaseModel  # noqa: E402

REQUEST = messages.Request("req-0123456789abcdef", "noop", {"seed": 3, "sub_job_id": "train"})
FINISHED = json.dumps(messages.encode(messages.succeeded("req-0123456789abcdef", {"ok": True, "at": 1.5})))


class PydanticRequest(BaseModel):
    type: str = "request"
    request_id: str
    op: str
    params: dict[str, Any] = {}


class PydanticFinished(BaseModel):
    type: str = "finished"
    request_id: str
    status: str
    result: dict[str, Any] | None = None
    code: str | None = None
    message: str | None = None


REQUEST_HEADER = {
    "type": "request",
    "request_id": REQUEST.request_id,
    "op": REQUEST.op,
    "params": REQUEST.params,
}


def untyped_way() -> None:
    # What the messages were before they were typed: dicts, through the same JSON.
    json.dumps(REQUEST_HEADER)
    json.loads(FINISHED)


def dataclasses_way() -> None:
    json.dumps(messages.encode(REQUEST))
    messages.decode(json.loads(FINISHED))


PYDANTIC_REQUEST = PydanticRequest(request_id=REQUEST.request_id, op=REQUEST.op, params=REQUEST.params)


def pydantic_way() -> None:
    PYDANTIC_REQUEST.model_dump_json()
    PydanticFinished.model_validate_json(FINISHED)


def msgspec_ways():
    try:
        import msgspec
    except ImportError:
        return None

    class Request(msgspec.Struct, tag="request", tag_field="type"):
        request_id: str
        op: str
        params: dict = {}

    class Finished(msgspec.Struct, tag="finished", tag_field="type"):
        request_id: str
        status: str
        result: dict | None = None
        code: str | None = None
        message: str | None = None

    encoder = msgspec.json.Encoder()
    decoder = msgspec.json.Decoder(Request | Finished)
    request = Request(REQUEST.request_id, REQUEST.op, REQUEST.params)
    finished = FINISHED.encode()

    def way() -> None:
        encoder.encode(request)
        decoder.decode(finished)

    return way


def timed(way, count: int) -> float:
    started = time.perf_counter()
    for _ in range(count):
        way()
    return (time.perf_counter() - started) / count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20000)
    args = parser.parse_args()
    ways = {
        "untyped dicts (before)": untyped_way,
        "dataclasses (worker_messages.py)": dataclasses_way,
        "pydantic models": pydantic_way,
    }
    msgspec_way = msgspec_ways()
    if msgspec_way is not None:
        ways["msgspec structs"] = msgspec_way
    times: dict[str, list[float]] = {name: [] for name in ways}
    batch = max(1, args.repeats // 20)
    for _ in range(20):
        for name, way in ways.items():
            times[name].append(timed(way, batch))
    base = statistics.median(times["dataclasses (worker_messages.py)"])
    for name, values in times.items():
        median = statistics.median(values)
        print(
            f"{name:36s} {median * 1e6:7.2f} us per request+finished  ratio to dataclasses {median / base:.2f}"
        )
    if msgspec_way is None:
        print("msgspec structs                      not installed in this environment")
    return 0


if __name__ == "__main__":
    sys.exit(main())
