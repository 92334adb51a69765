"""The local executor's side of the worker fork server (worker_forkserver.py): CPU workers forked from a
process that imported torch, transformers and peft once, instead of each importing them (nine seconds of
CPU a worker here) and holding its own copy of their pages.

`ForkServer.fork` returns a `ForkedProcess`, which has the parts of `asyncio.subprocess.Process` the
executor uses (pid, returncode, wait, stdout, stderr; it signals a worker's process group itself). If the
fork server cannot start, or dies, the executor starts its workers as processes again (`usable` turns false).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import signal
import socket
import sys
from typing import Any

from ..worker_forkserver import MAX_REQUEST_BYTES

log = logging.getLogger("cortex_backend.executors.forkserver")

READY_TIMEOUT_S = 180.0
MAX_REPLY_BYTES = 1 << 16


class ForkedProcess:
    """A worker the fork server forked: its pid, its output pipes, and its exit as the server reports it."""

    def __init__(
        self, pid: int, stdout: asyncio.StreamReader, stderr: asyncio.StreamReader, exited: asyncio.Future
    ):
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self._exited = exited

    @property
    def returncode(self) -> int | None:
        return self._exited.result() if self._exited.done() else None

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)


class ForkServer:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.usable = True
        self._control: socket.socket | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._started: asyncio.Future | None = None
        self._ids = itertools.count()
        self._replies: dict[int, asyncio.Future] = {}
        self._exits: dict[int, asyncio.Future] = {}
        self._early_exits: dict[int, int] = {}
        self._start_lock = asyncio.Lock()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "cortex_backend.worker_forkserver",
                "--fd",
                str(theirs.fileno()),
                pass_fds=(theirs.fileno(),),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
            )
        finally:
            theirs.close()
        ours.setblocking(False)
        self._control = ours
        self._started = loop.create_future()
        loop.add_reader(ours.fileno(), self._on_readable)
        try:
            await asyncio.wait_for(asyncio.shield(self._started), READY_TIMEOUT_S)
        except asyncio.TimeoutError:
            self._fail("the fork server did not get ready in time")

    async def ensure_started(self) -> bool:
        """Start the fork server once; whether workers can be forked from it."""
        async with self._start_lock:
            if self._control is None and self.usable:
                try:
                    await self._start()
                except OSError as exc:
                    self._fail(f"the fork server did not start: {exc}")
        return self.usable

    async def fork(self, env: dict[str, str], channel: socket.socket) -> ForkedProcess:
        """A worker serving `channel`, with `env` as its environment. Raises OSError if the server is gone."""
        loop = asyncio.get_running_loop()
        request_id = next(self._ids)
        request = json.dumps({"id": request_id, "env": env}).encode()
        if len(request) > MAX_REQUEST_BYTES:
            raise OSError("the worker's environment is too large to pass to the fork server")
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        reply = self._replies[request_id] = loop.create_future()
        try:
            assert self._control is not None
            socket.send_fds(
                self._control,
                [request],
                [channel.fileno(), out_write, err_write],
            )
        except (OSError, AssertionError) as exc:
            self._replies.pop(request_id, None)
            for fd in (out_read, err_read):
                os.close(fd)
            raise OSError(f"the fork server is gone: {exc}") from None
        finally:
            os.close(out_write)
            os.close(err_write)
        try:
            pid = await reply
        except OSError:
            for fd in (out_read, err_read):
                os.close(fd)
            raise
        return ForkedProcess(
            pid, await self._reader(out_read), await self._reader(err_read), self._exits[pid]
        )

    async def _reader(self, fd: int) -> asyncio.StreamReader:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=2**16, loop=loop)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", 0))
        return reader

    def _on_readable(self) -> None:
        assert self._control is not None
        while True:
            try:
                data = self._control.recv(MAX_REPLY_BYTES)
            except BlockingIOError:
                return
            except OSError as exc:
                self._fail(f"the fork server's socket failed: {exc}")
                return
            if not data:
                self._fail("the fork server exited")
                return
            self._on_message(json.loads(data))

    def _on_message(self, message: dict[str, Any]) -> None:
        loop = asyncio.get_running_loop()
        if "ready" in message:
            if self._started and not self._started.done():
                self._started.set_result(None)
        elif "failed" in message:
            self._fail(f"the fork server could not import the worker's libraries: {message['failed']}")
        elif "exited" in message:
            pid, returncode = int(message["exited"]), int(message["returncode"])
            exited = self._exits.get(pid)
            if exited is None:
                self._early_exits[pid] = returncode
            elif not exited.done():
                exited.set_result(returncode)
        elif "pid" in message:
            pid = int(message["pid"])
            exited = self._exits[pid] = loop.create_future()
            if pid in self._early_exits:
                exited.set_result(self._early_exits.pop(pid))
            reply = self._replies.pop(int(message["id"]), None)
            if reply is not None and not reply.done():
                reply.set_result(pid)
        elif "error" in message:
            reply = self._replies.pop(int(message["id"]), None)
            if reply is not None and not reply.done():
                reply.set_exception(OSError(message["error"]))

    def _fail(self, reason: str) -> None:
        """The server is gone or never came: its workers died with it (they are its children, and die with
        their parent); new workers start as processes."""
        if self.usable:
            log.warning("%s; workers start as processes of their own from now on", reason)
        self._close_control()
        if self._started and not self._started.done():
            self._started.set_result(None)
        for reply in self._replies.values():
            if not reply.done():
                reply.set_exception(OSError(reason))
        self._replies.clear()
        for exited in self._exits.values():
            if not exited.done():
                exited.set_result(-signal.SIGKILL)

    def _close_control(self) -> None:
        """No more forks: stop reading the server's socket and close it (the server exits when it sees that)."""
        self.usable = False
        if self._control is not None and self._control.fileno() != -1:
            with contextlib.suppress(ValueError, RuntimeError):
                asyncio.get_running_loop().remove_reader(self._control.fileno())
            self._control.close()

    async def close(self) -> None:
        """Close the socket (the server exits when it sees that) and reap the server."""
        self._close_control()
        if self._process is not None and self._process.returncode is None:
            try:
                await asyncio.wait_for(self._process.wait(), 5)
            except asyncio.TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self._process.kill()
                await self._process.wait()
