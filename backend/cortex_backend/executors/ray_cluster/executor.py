"""RayExecutor: each sub-job is a Ray actor on one of the cluster's hosts, running the local executor's
worker code. The control plane (Tornado, SQLite, tokens, logs, the checkpoint index) stays here, on the head.

The service's scheduler chooses a device for each sub-job, as it does locally (strict FIFO, the queue it
reports); Ray reserves it: the actor asks for `num_gpus` (1 / the GPU's slots) or one CPU, for the
`cortex-model:<name>` resource of its model, and for the chosen node (hard affinity). So Ray refuses to
run a sub-job where its model is not, and Ray sets the actor's CUDA_VISIBLE_DEVICES.

Messages go both ways through Ray calls (sub_job_actor.py): `send` carries what the local executor
writes to a worker's socket, one waiting `next_messages` per actor brings back what the worker writes.
A dead actor fails its sub-job with `worker_crashed`; a host whose node leaves fails its sub-jobs with
`host_lost`. Hosts are read from Ray every second (hosts.py), and the service hears of every change.

A training sub-job across devices (`n_gpus` > 1) is a rank group (rank_groups.py): one actor per rank, held
together on its host by a placement group (STRICT_PACK, one bundle per rank with the resources a one-device
actor asks for). Every rank gets the same messages under the same sequence numbers; only rank 0's replies
reach the service; any rank's death fails the sub-job and takes every rank's actor and the placement group
with it. A sampling sub-job across devices (vLLM's tensor parallelism) is one actor holding the resources of
all its devices on one host; its engine starts its own shard processes (not run on Ray in the tests here).

Sub-jobs that the hosting choice makes adapter-host slots (base.Hosting: on GPUs by default, on every
device with `--adapter-host`) share one actor per (host, device, base model) instead (host_actors.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ... import worker_messages as messages
from ...config import BackendSettings
from ...devices import Device, detect_devices
from ...models import ModelInfo, inspect_model_dir
from ...slot_batching import batched_operations
from ..base import (
    Executor,
    ExecutorListener,
    ExecutorStartRefused,
    Hosting,
    SubJobAssignment,
    WorkerSettings,
    init_message,
    report_message,
    slot_key,
)
from ..rank_groups import RankGroupState, rank_inits, shared_gpu_refusal
from .checkpoint_transfer import STAGED_FILES, TransferError, read_checkpoint_files, write_checkpoint_files
from .cluster_token import (
    TOKEN_FILE_NAME,
    ClusterTokenError,
    apply_to_this_process,
    cluster_takes_anyone,
    disabled_environment,
    ensure_token_file,
    read_token_file,
    token_environment,
)
from .confinement import (
    PrivateDirError,
    address_is_loopback,
    keep_loopback_in_this_process,
    private_root,
    ray_temp_dir,
    remove_root,
)
from .head import RayHead
from .host_actors import HostActor, HostActorKey, lines_by_slot
from .host_monitor import ClusterSampler
from .hosts import ClusterHosts, Host, node_is_alive
from .registry import (
    HEAD_KEY,
    HOST_PREFIX,
    MODEL_RESOURCE_PER_SUB_JOB,
    ClusterStore,
    head_record,
    host_record,
    host_resource,
    model_resource,
    node_resources,
)
from .sub_job_actor import ACTOR_CONCURRENCY, SubJobActor
from .versions import local_versions

log = logging.getLogger("cortex_backend.executors.ray_cluster")

NAMESPACE = "cortex-nb"
POLL_S = 5.0  # how long one next_messages call waits in the actor for news
HOSTS_POLL_S = 1.0
UNAVAILABLE_RETRY_S = (
    0.5  # an actor Ray cannot reach right now: ask again (its death comes as ActorDiedError)
)
STOP_GRACE_S = 3.0
# How long a rank group's placement group may wait for its host to hold every rank at once: past it the
# sub-job fails `exceeds_capacity` instead of waiting on Ray for ever.
PLACEMENT_WAIT_S = 60.0
# A request's payload above this goes once into Ray's object store for all the ranks, not once per rank.
SHARED_PAYLOAD_BYTES = 1 << 16


class StoredBlob:
    """A weight-sync payload left in Ray's object store: it goes from the sender's host straight to the
    receiver's, never through the head. len() is its size, as for the bytes it stands for."""

    __slots__ = ("ref", "size")

    def __init__(self, ref: Any, size: int) -> None:
        self.ref = ref
        self.size = size

    def __len__(self) -> int:
        return self.size


@dataclass
class ActorSubJob:
    assignment: SubJobAssignment
    host: Host
    # One actor per rank, rank 0 first (one actor for a sub-job on one device).
    actors: list[Any]
    sequence: int = 0
    stopping: bool = False
    # One task per actor bringing back what its worker sends.
    pumps: list[asyncio.Task] = field(default_factory=list)
    # Where Ray placed each actor (node, pid, GPUs), rank 0 first.
    placements: list[dict[str, Any]] = field(default_factory=list)
    # save request id -> the directory on the head its files go to
    saves: dict[str, Path] = field(default_factory=dict)
    # A sub-job across devices: its ranks' bookkeeping, and the placement group that holds them together.
    group: RankGroupState | None = None
    placement_group: Any = None
    # A slot of an adapter-host actor (host_actors.py): its messages go through the host's inbox, addressed
    # to the slot; `released` is set when the slot has ended there; `slot_bytes` what it adds to the host.
    hosted_by: HostActor | None = None
    released: asyncio.Event = field(default_factory=asyncio.Event)
    slot_bytes: int = 0

    @property
    def slot(self) -> str:
        return slot_key(self.assignment.job_id, self.assignment.sub_job_id)

    @property
    def placement(self) -> dict[str, Any]:
        """Where rank 0 (the sub-job's one actor, on one device) runs."""
        return self.placements[0] if self.placements else {}

    def next_sequence(self) -> int:
        if self.hosted_by is not None:
            return self.hosted_by.next_sequence()
        self.sequence += 1
        return self.sequence - 1

    def send(
        self,
        header: dict[str, Any],
        blob: Any = b"",
        files: dict[str, bytes] | None = None,
        sequence: int | None = None,
    ) -> None:
        """Queue a message for the worker, for every rank's worker alike (Ray resolves a stored payload into
        bytes on the actor's host)."""
        if sequence is None:
            sequence = self.next_sequence()
        if self.hosted_by is not None:
            header = {**header, messages.SLOT_KEY: self.slot}
        payload = blob.ref if isinstance(blob, StoredBlob) else blob
        if len(self.actors) > 1 and isinstance(payload, bytes) and len(payload) > SHARED_PAYLOAD_BYTES:
            import ray

            payload = ray.put(payload)
        for actor in self.actors:
            actor.send.remote(sequence, header, payload, files)


class RayExecutor(Executor):
    runs_on_this_host = False

    def __init__(self, listener: ExecutorListener, settings: BackendSettings) -> None:
        super().__init__(listener)
        self.settings = settings
        self.address = settings.ray_address
        self.head: RayHead | None = None
        self.store: ClusterStore | None = None
        self.cluster: ClusterHosts | None = None
        self.hosts: dict[str, Host] = {}
        self.devices: list[Device] = []
        self.sampler = ClusterSampler(timeout_s=max(0.5, min(settings.monitor_interval_s, 5.0)))
        self._sub_jobs: dict[tuple[str, str], ActorSubJob] = {}
        self.hosting = Hosting(settings.adapter_host)
        self._host_actors: dict[HostActorKey, HostActor] = {}
        self._backlog: dict[tuple[str, str], list[tuple[dict[str, Any], Any]]] = defaultdict(list)
        self._tasks: set[asyncio.Task] = set()
        self._watcher: asyncio.Task | None = None
        self._actor_class: Any = None
        # One reading of the hosts at a time (the watcher, and a death that may be a host's).
        self._hosts_lock = asyncio.Lock()
        # Whether the cluster takes clients without Ray's token (only ever with --ray-insecure).
        self.insecure = False
        self._temp_root: Path | None = None
        self._temp_root_made = False

    # start and stop ---------------------------------------------------------------------------
    async def start(self) -> None:
        own = self._own_host()
        if self.address is None:
            node = (
                node_resources(own[0], own[1], list(own[2]))
                if own
                else {"num_cpus": 0, "num_gpus": 0, "resources": {}}
            )
            try:
                auth_env = token_environment(ensure_token_file(self.token_file))
                self._temp_root, self._temp_root_made = private_root(self.settings.ray_temp_dir)
            except (ClusterTokenError, PrivateDirError) as exc:
                raise ExecutorStartRefused(str(exc)) from None
            apply_to_this_process(auth_env)
            self.head = await RayHead.start(
                node,
                self.settings.ray_port,
                self.settings.ray_object_store_bytes,
                ray_temp_dir(self._temp_root),
                self.settings.data_dir / "ray-head.log",
                self.settings.host,
                auth_env,
            )
            self.address = self.head.address
        else:
            await asyncio.to_thread(self._choose_authentication)
        if self.head is None and own is not None:
            log.warning(
                "--ray-address: this backend joins a cluster and serves no devices of its own; hosts join with"
                " `cortex-nb host join`"
            )
            own = None
        await asyncio.to_thread(self._connect, own)
        await self._refresh_hosts()
        self._watcher = asyncio.create_task(self._watch_hosts())
        log.info(
            "Ray executor: cluster at %s; hosts join with `cortex-nb host join %s --token-file FILE`, FILE a"
            " copy of %s",
            self.address,
            self.address,
            self.token_file,
        )

    @property
    def token_file(self) -> Path:
        return self.settings.ray_token_file or self.settings.data_dir / TOKEN_FILE_NAME

    def _choose_authentication(self) -> None:
        """For a cluster of someone else's (`--ray-address`): its token if it asks for one; none only if
        it takes anyone and the operator said so (`--ray-insecure`)."""
        try:
            takes_anyone = cluster_takes_anyone(self.address)
            if takes_anyone and not self.settings.ray_insecure:
                raise ExecutorStartRefused(
                    f"the Ray cluster at {self.address} runs without token authentication: anyone who reaches"
                    " its ports can run code as its user. Start it with RAY_AUTH_MODE=token and put its token in"
                    f" {self.token_file} (or name the file with --ray-token-file); --ray-insecure joins it as"
                    " it is"
                )
            if takes_anyone:
                self.insecure = True
                log.warning(
                    "--ray-insecure: the Ray cluster at %s takes clients without a token; anyone who reaches"
                    " its ports can run code as its user",
                    self.address,
                )
                apply_to_this_process(disabled_environment())
                return
            read_token_file(self.token_file)
        except ClusterTokenError as exc:
            raise ExecutorStartRefused(str(exc)) from None
        apply_to_this_process(token_environment(self.token_file))

    def _own_host(self) -> tuple[str, list[Device], dict[str, ModelInfo]] | None:
        """The head's own devices and models, served like a joined host's (unless `--devices none`)."""
        if self.settings.devices.strip().lower() == "none":
            return None
        import socket

        devices = detect_devices(self.settings.devices, self.settings.sub_jobs_per_device)
        models = {name: inspect_model_dir(name, path) for name, path in self.settings.models.items()}
        return self.settings.host_name or socket.gethostname(), devices, models

    def _connect(self, own: tuple[str, list[Device], dict[str, ModelInfo]] | None) -> None:
        # An actor's failed call that nobody reads (a send to a dead actor) is expected here, not news.
        os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")
        if address_is_loopback(self.address):
            keep_loopback_in_this_process()
        import ray

        ray.init(address=self.address, namespace=NAMESPACE, log_to_driver=False, configure_logging=False)
        self._actor_class = ray.remote(SubJobActor)
        self.store = ClusterStore(ray.get_runtime_context().gcs_address)
        versions = local_versions()
        self.store.put(HEAD_KEY, head_record(versions, self.address))
        if own is not None:
            name, devices, models = own
            self.store.put(HOST_PREFIX + name, host_record(name, versions, devices, models))
        self.cluster = ClusterHosts(self.store, self.settings.data_dir / "cluster-models")

    async def shutdown(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        await asyncio.gather(
            *(self.stop_sub_job(*key) for key in list(self._sub_jobs)), return_exceptions=True
        )
        if self.store is not None:
            import ray

            self.sampler.stop()
            await asyncio.to_thread(ray.shutdown)
        if self.head is not None:
            await asyncio.to_thread(self.head.stop)
        if self._temp_root is not None and self._temp_root_made:
            await asyncio.to_thread(remove_root, self._temp_root)

    # hosts ------------------------------------------------------------------------------------
    async def _watch_hosts(self) -> None:
        while True:
            await asyncio.sleep(HOSTS_POLL_S)
            try:
                await self._refresh_hosts()
            except Exception:
                log.exception("reading the cluster's hosts failed")

    async def _refresh_hosts(self) -> None:
        async with self._hosts_lock:
            await self._read_hosts()

    async def _read_hosts(self) -> None:
        hosts = await asyncio.to_thread(self.cluster.read)
        if hosts == self.hosts:
            return
        gone = {
            name
            for name, host in self.hosts.items()
            if name not in hosts or hosts[name].node_id != host.node_id
        }
        joined = sorted(name for name in hosts if name not in self.hosts or name in gone)
        models = await asyncio.to_thread(self.cluster.models)
        self.hosts = hosts
        self.devices = self.hosting.with_adapter_slots(
            [device for name in sorted(hosts) for device in hosts[name].devices],
            self.settings.adapter_slots_per_device,
        )
        for name in sorted(gone):
            log.warning("host %s left the cluster", name)
        for name in joined:
            log.info(
                "host %s joined: %s",
                name,
                ", ".join(f"{d.id} ({d.slots} slots)" for d in hosts[name].devices),
            )
        self.sampler.update(hosts)
        # The service hears of the new devices first, so the slots the lost sub-jobs free below are never
        # given to a queued job on a host that is gone.
        self.listener.devices_changed(list(self.devices), models)
        for sub in list(self._sub_jobs.values()):
            if sub.host.name in gone:
                self._fail(sub, "host_lost", _host_lost_message(sub))

    def current_devices(self) -> list[Device]:
        return list(self.devices)

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {
            "name": "ray",
            "hosting": self.hosting.word,
            "ray_address": self.address,
            "hosts": sorted(self.hosts),
            "ray_insecure": self.insecure,
        }
        if self.hosting.adapter_host is not False:
            setting = self.settings.batch_across_slots
            gpus = {device.id for device in self.devices if device.kind == "cuda"}
            described["batch_across_slots"] = setting
            described["adapter_hosts"] = [
                {
                    **self._host_actors[key].describe(),
                    "batched_operations": sorted(batched_operations(setting, key[1] in gpus)),
                }
                for key in sorted(self._host_actors)
            ]
        return described

    def device_sampler(self) -> ClusterSampler:
        return self.sampler

    # sub-jobs ---------------------------------------------------------------------------------
    async def start_sub_job(self, assignment: SubJobAssignment) -> None:
        key = (assignment.job_id, assignment.sub_job_id)
        refusal = self._rank_group_refusal(assignment)
        if refusal is not None:
            self.listener.sub_job_failed(assignment.job_id, assignment.sub_job_id, *refusal)
            return
        host = self.hosts.get(assignment.device.host)
        if host is None:
            self.listener.sub_job_failed(
                assignment.job_id,
                assignment.sub_job_id,
                "host_lost",
                f"host {assignment.device.host} left the cluster before {assignment.sub_job_id} started",
            )
            return
        model = assignment.model
        if model.kind == "local":  # the weights are in the host's own directory for this model
            model = ModelInfo(
                model.name, model.kind, Path(host.model_path(model.name) or str(model.path)), model.config
            )
        if self.hosting.hosts(assignment):
            await self._start_slot(assignment, host, model)
            return
        if assignment.rank_group:
            try:
                await self._start_rank_group(assignment, host, model)
            except Exception as exc:  # Ray refused the placement group or the actors: say so, never hang
                log.exception("starting the ranks of %s failed", assignment.sub_job_id)
                sub = self._sub_jobs.get(key)
                message = f"its {len(assignment.rank_devices)} ranks could not be started on Ray: {exc}"
                if sub is not None:
                    self._fail(sub, "worker_start_failed", message)
                else:
                    self.listener.sub_job_failed(
                        assignment.job_id, assignment.sub_job_id, "worker_start_failed", message
                    )
            return
        options = self._actor_options(assignment.device, host, model.name)
        if assignment.tensor_parallel:  # one actor whose vLLM engine spans the sub-job's devices on its host
            count = len(assignment.rank_devices)
            options = {
                **options,
                "num_gpus": options["num_gpus"] * count,
                "num_cpus": options["num_cpus"] * count,
            }
        actor = self._actor_class.options(**options).remote()
        sub = ActorSubJob(assignment, host, [actor])
        self._sub_jobs[key] = sub
        # The GPU the scheduler chose, as locally (Ray's num_gpus reserves the host's share; naming the device
        # keeps each sample attributed to the sub-job really on it); a CPU sub-job sees none.
        sub.send(messages.encode(init_message(assignment, WorkerSettings.from_backend(self.settings), model)))
        for header, blob in self._backlog.pop(key, []):
            self._send(sub, header, blob)
        sub.pumps = [self._spawn(self._pump(sub))]

    async def _start_slot(self, assignment: SubJobAssignment, host: Host, model: ModelInfo) -> None:
        """The sub-job as a slot of its (host, device, base) adapter-host actor, started if there is none.
        Its init and requests go to the actor at once: the host queues a slot's requests behind its init."""
        settings = WorkerSettings.from_backend(self.settings)
        key = (host.name, assignment.device.id, model.name)
        hosting = self._host_actors.get(key)
        if hosting is None or hosting.stopping:  # nothing is awaited here: one actor per key
            options = self._actor_options(assignment.device, host, model.name)
            hosting = HostActor(key, host, self._actor_class.options(**options).remote())
            hosting.send(
                messages.encode(
                    messages.HostAdapters(
                        assignment.device.worker_env(),
                        settings.threads,
                        settings.adapter_host_memory_bytes,
                        settings.batch_across_slots,
                    )
                )
            )
            self._host_actors[key] = hosting
            hosting.pump = self._spawn(self._pump_host(hosting))
        sub = ActorSubJob(assignment, host, [hosting.actor], placements=hosting.placements, hosted_by=hosting)
        hosting.slots[sub.slot] = sub
        self._sub_jobs[(assignment.job_id, assignment.sub_job_id)] = sub
        sub.send(messages.encode(init_message(assignment, settings, model)))
        for header, blob in self._backlog.pop((assignment.job_id, assignment.sub_job_id), []):
            self._send(sub, header, blob)

    @staticmethod
    def _rank_group_refusal(assignment: SubJobAssignment) -> tuple[str, str] | None:
        """(code, message) when a sub-job's ranks (or a tensor-parallel sampler's devices) cannot run as
        placed: on two hosts (a rank group's actors share one node; a sampler is one actor), or two on one
        GPU; None otherwise."""
        devices = assignment.rank_devices
        if not devices:
            return None
        hosts = sorted({device.host for device in devices})
        if len(hosts) > 1:
            return (
                "exceeds_capacity",
                f"{assignment.sub_job_id} asks for n_gpus={len(devices)}: its ranks run together on one host,"
                f" and no host had {len(devices)} free slots, so they were placed on hosts {', '.join(hosts)}."
                " Create it with n_gpus no larger than one host's slots (GET /v1/capacity lists each host's),"
                " or join a host with more devices",
            )
        refusal = shared_gpu_refusal(devices)
        return ("worker_start_failed", refusal) if refusal is not None else None

    async def _start_rank_group(self, assignment: SubJobAssignment, host: Host, model: ModelInfo) -> None:
        """One actor per rank in a placement group on the host the scheduler chose; once Ray has placed
        them, rank 0's actor picks the rendezvous (its node's address, a port free there) and every rank
        gets its `init`. Requests sent meanwhile queue behind the init (its sequence number is taken first)."""
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        key = (assignment.job_id, assignment.sub_job_id)
        devices = assignment.rank_devices
        options = [self._actor_options(device, host, model.name) for device in devices]
        # Each bundle holds what its rank's actor asks for, on this host (its resource) and nowhere else.
        bundles = [
            {
                name: amount
                for name, amount in {
                    "CPU": option["num_cpus"],
                    "GPU": option["num_gpus"],
                    **option["resources"],
                    host_resource(host.name): MODEL_RESOURCE_PER_SUB_JOB,
                }.items()
                if amount
            }
            for option in options
        ]
        group = placement_group(bundles, strategy="STRICT_PACK")
        actors = [
            self._actor_class.options(
                **{
                    **option,
                    "scheduling_strategy": PlacementGroupSchedulingStrategy(
                        group, placement_group_bundle_index=rank
                    ),
                }
            ).remote()
            for rank, option in enumerate(options)
        ]
        sub = ActorSubJob(assignment, host, actors, group=RankGroupState(assignment), placement_group=group)
        init_sequence = sub.next_sequence()
        self._sub_jobs[key] = sub
        for header, blob in self._backlog.pop(key, []):
            self._send(sub, header, blob)
        try:
            await asyncio.wait_for(group.ready(), PLACEMENT_WAIT_S)
        except asyncio.TimeoutError:
            if not sub.stopping:
                self._fail(
                    sub,
                    "exceeds_capacity",
                    f"host {host.name} could not hold the {len(devices)} ranks of {assignment.sub_job_id}"
                    f" together within {PLACEMENT_WAIT_S:.0f} s (a Ray placement group of {len(devices)}"
                    f" bundles, each {bundles[0]}, on one node); GET /v1/capacity shows each host's free slots."
                    " Create it again with fewer ranks, or when the host is free",
                )
            return
        except Exception:
            if sub.stopping:  # stopped meanwhile: its placement group was removed under the wait
                return
            raise
        if sub.stopping:
            return
        found = await asyncio.gather(*(actor.placement.remote() for actor in actors), return_exceptions=True)
        died = next(((rank, exc) for rank, exc in enumerate(found) if isinstance(exc, Exception)), None)
        if died is None:
            sub.placements = list(found)
            try:
                address, port = await actors[0].rendezvous.remote()
            except Exception as exc:
                died = (0, exc)
        if died is not None:
            await self._actor_died(sub, died[1], died[0])
            return
        if sub.stopping:
            return
        base = init_message(assignment, WorkerSettings.from_backend(self.settings), model)
        for actor, init in zip(actors, rank_inits(base, devices, address, port), strict=True):
            actor.send.remote(init_sequence, messages.encode(init), b"", None)
        sub.pumps = [self._spawn(self._pump(sub, rank)) for rank in range(len(actors))]

    @staticmethod
    def _actor_options(device: Device, host: Host, model: str) -> dict[str, Any]:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        on_gpu = device.kind == "cuda"
        return {
            "num_gpus": 1.0 / device.slots if on_gpu else 0,
            "num_cpus": 0 if on_gpu else 1,
            "resources": {model_resource(model): MODEL_RESOURCE_PER_SUB_JOB},
            "scheduling_strategy": NodeAffinitySchedulingStrategy(host.node_id, soft=False),
            "max_concurrency": ACTOR_CONCURRENCY,
            "max_restarts": 0,
            "max_task_retries": 0,
        }

    def submit(
        self, job_id: str, sub_job_id: str, request_id: str, op: str, params: dict[str, Any], blob: bytes
    ) -> None:
        header = messages.encode(messages.Request(request_id, op, params))
        if not isinstance(blob, bytes):
            blob = bytes(memoryview(blob))  # an assembled upload is a memory map, which Ray cannot serialise
        sub = self._sub_jobs.get((job_id, sub_job_id))
        if sub is None:
            self._backlog[(job_id, sub_job_id)].append((header, blob))
            return
        self._send(sub, header, blob)

    def _send(self, sub: ActorSubJob, header: dict[str, Any], blob: Any) -> None:
        if header.get("type") == "request" and header["op"] == "save":
            sub.saves[header["request_id"]] = Path(header["params"]["directory"])
        if header.get("type") == "request" and header["op"] == "load":
            # The checkpoint's files go with the request; read them off the IO loop, keeping the order.
            self._spawn(self._send_load(sub, sub.next_sequence(), header))
            return
        sub.send(header, blob)

    async def _send_load(self, sub: ActorSubJob, sequence: int, header: dict[str, Any]) -> None:
        try:
            files = await asyncio.to_thread(read_checkpoint_files, Path(header["params"]["directory"]))
        except OSError as exc:  # the worker then finds the files missing and fails the load, naming them
            log.warning("reading checkpoint files for %s failed: %s", header["request_id"], exc)
            files = {}
        sub.send(header, b"", files, sequence=sequence)

    def cancel_request(self, job_id: str, sub_job_id: str, request_id: str) -> None:
        key = (job_id, sub_job_id)
        if key in self._backlog:
            self._backlog[key] = [
                item for item in self._backlog[key] if item[0].get("request_id") != request_id
            ]
        sub = self._sub_jobs.get(key)
        if sub is not None:
            sub.send(messages.encode(messages.Cancel(request_id)))

    def deliver(self, job_id: str, sub_job_id: str, header: dict[str, Any], blob: Any) -> None:
        sub = self._sub_jobs.get((job_id, sub_job_id))
        if sub is not None:
            sub.send(header, blob)

    async def stop_sub_job(self, job_id: str, sub_job_id: str) -> None:
        self._backlog.pop((job_id, sub_job_id), None)
        sub = self._sub_jobs.pop((job_id, sub_job_id), None)
        if sub is None:
            return
        sub.stopping = True
        sub.send(messages.encode(messages.Shutdown()))
        if sub.hosted_by is not None:  # its managed loop ends its step and saves, as in an actor of its own
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(sub.released.wait(), STOP_GRACE_S)
            await self._leave_host(sub)
            return

        async def close(actor: Any) -> None:
            try:
                await asyncio.wait_for(actor.close.remote(STOP_GRACE_S), STOP_GRACE_S + 2.0)
            except Exception:  # gone already, or stuck in an operation: it is killed either way
                pass

        await asyncio.gather(*(close(actor) for actor in sub.actors))
        self._release(sub)

    def _release(self, sub: ActorSubJob) -> None:
        """Kill every actor of a sub-job and remove its placement group: its devices are Ray's again."""
        import ray
        from ray.util.placement_group import remove_placement_group

        if sub.hosted_by is not None:  # the actor serves other slots: the slot leaves it
            self._spawn(self._leave_host(sub))
            return
        for pump in sub.pumps:
            if pump is not asyncio.current_task():
                pump.cancel()
        for actor in sub.actors:
            with contextlib.suppress(Exception):  # already gone (with its host)
                ray.kill(actor)
        if sub.placement_group is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(sub.placement_group)

    # messages from actors -----------------------------------------------------------------------
    async def _batches(
        self, actor: Any, stopping: Callable[[], bool]
    ) -> AsyncIterator[list[tuple[Any, Any]]]:
        """What an actor's worker sends, a batch at a time, until `stopping()`; an actor Ray cannot reach
        right now is asked again (its death raises ActorDiedError)."""
        import ray

        while not stopping():
            try:
                yield await actor.next_messages.remote(POLL_S)
            except ray.exceptions.ActorUnavailableError:
                await asyncio.sleep(UNAVAILABLE_RETRY_S)

    async def _pump(self, sub: ActorSubJob, rank: int = 0) -> None:
        actor = sub.actors[rank]
        try:
            if not sub.placements:  # a rank group's were read before its ranks started
                sub.placements = [await actor.placement.remote()]
            async for batch in self._batches(actor, lambda: sub.stopping):
                for header, blob in batch:
                    await self._on_message(sub, header, blob, rank)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # ActorDiedError, or an actor Ray could not place at all
            await self._actor_died(sub, exc, rank)

    async def _pump_host(self, hosting: HostActor) -> None:
        try:
            hosting.placements.append(await hosting.actor.placement.remote())
            async for batch in self._batches(hosting.actor, lambda: hosting.stopping):
                for header, blob in batch:
                    await self._on_host_message(hosting, header, blob)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if hosting.stopping:
                return
            alive = await asyncio.to_thread(node_is_alive, hosting.host.node_id)
            if not alive:  # the host's node is gone: its slots fail host_lost (see _refresh_hosts)
                await self._refresh_hosts()
            self._host_failed(hosting, f"its Ray actor died ({_reason(exc)})")

    async def _on_host_message(self, hosting: HostActor, header: dict[str, Any], blob: Any) -> None:
        """An adapter-host actor's message, filed under the slot it concerns (host_actors.py)."""
        kind = header.get("type")
        if kind == "log":
            for slot, lines in lines_by_slot(hosting.slots, header["lines"]).items():
                sub = hosting.slots[slot]
                self.listener.log_lines(
                    sub.assignment.job_id, sub.assignment.sub_job_id, header["stream"], lines
                )
            return
        if kind == "worker_exited":
            if not hosting.stopping:
                self._host_failed(hosting, f"its worker stopped ({header.get('reason')})")
            return
        sub = hosting.slots.get(messages.slot_of(header) or "")
        if sub is None:
            return
        if kind == messages.Released.kind:
            sub.released.set()
            return
        if kind == messages.Ready.kind:
            info = header.get("info") or {}
            sub.slot_bytes = int(info.get("slot_bytes") or 0)
            hosting.base_bytes = int((info.get("adapter_host") or {}).get("base_bytes") or 0)
        await self._on_message(sub, {k: v for k, v in header.items() if k != messages.SLOT_KEY}, blob)

    def _host_failed(self, hosting: HostActor, why: str) -> None:
        """The actor of an adapter host is gone: every slot it served fails, each resumable from its
        checkpoints (a slot whose host left the cluster has failed `host_lost` already)."""
        served = len(hosting.slots)
        self._forget_host(hosting)
        for sub in list(hosting.slots.values()):
            hosting.slots.pop(sub.slot, None)
            if sub.stopping:
                continue
            key = (sub.assignment.job_id, sub.assignment.sub_job_id)
            if self._sub_jobs.get(key) is sub:
                del self._sub_jobs[key]
            sub.stopping = True
            self.listener.sub_job_failed(
                sub.assignment.job_id,
                sub.assignment.sub_job_id,
                "worker_crashed",
                f"the adapter host serving {sub.assignment.sub_job_id} on host {hosting.host_name} failed: {why},"
                f" failing its {served} slot(s); see the job's logs. Jobs on other actors are unaffected.",
            )
        self._spawn(self._close_host(hosting))

    async def _leave_host(self, sub: ActorSubJob) -> None:
        """A slot has stopped: it leaves its actor, and the actor stops with its last slot."""
        hosting = sub.hosted_by
        hosting.slots.pop(sub.slot, None)
        if not hosting.slots and self._host_actors.get(hosting.key) is hosting:
            self._forget_host(hosting)
            hosting.send(messages.encode(messages.Shutdown()))
            await self._close_host(hosting)

    def _forget_host(self, hosting: HostActor) -> None:
        hosting.stopping = True
        if self._host_actors.get(hosting.key) is hosting:
            del self._host_actors[hosting.key]

    async def _close_host(self, hosting: HostActor) -> None:
        import ray

        with contextlib.suppress(Exception):  # gone already, or stuck: it is killed either way
            await asyncio.wait_for(hosting.actor.close.remote(STOP_GRACE_S), STOP_GRACE_S + 2.0)
        if hosting.pump is not None and hosting.pump is not asyncio.current_task():
            hosting.pump.cancel()
        with contextlib.suppress(Exception):
            ray.kill(hosting.actor)

    async def _on_message(self, sub: ActorSubJob, header: dict[str, Any], blob: Any, rank: int = 0) -> None:
        """A worker's message; of a rank group's, every rank's logs, readiness and failures count, and
        otherwise rank 0 alone speaks for the sub-job (the other ranks reply the same)."""
        import ray

        assignment = sub.assignment
        group = sub.group
        kind = header.get("type")
        if sub.stopping or kind in ("hello", "warm"):
            return
        if kind == "log":
            tag = f"[rank {rank}] " if group is not None else ""
            self.listener.log_lines(
                assignment.job_id,
                assignment.sub_job_id,
                header["stream"],
                [(float(at), tag + line) for at, line in header["lines"]],
            )
            return
        if kind == "ready":
            info = header.get("info") or {}
            if group is not None:
                if not group.rank_ready(rank, info):
                    return
                devices = [device.id for device in assignment.rank_devices]
                info = group.ready_info(
                    [
                        (placement.get("pid"), device)
                        for placement, device in zip(sub.placements, devices, strict=True)
                    ]
                )
            info = {
                **info,
                "host": sub.host.name,
                "node_id": sub.placement.get("node_id"),
                "gpu_ids": sub.placement.get("gpu_ids", []),
            }
            self.listener.sub_job_ready(assignment.job_id, assignment.sub_job_id, info)
            return
        if kind == "worker_exited":
            self._fail(sub, "worker_crashed", self._died_message(sub, rank, str(header.get("reason"))))
            return
        if kind == "init_failed":
            sub.stopping = True
            if group is not None:
                group.end()
                header = group.failed_start(rank, header)
        elif rank != 0:
            return
        if kind == "finished" and STAGED_FILES in header:
            header = await self._keep_save(sub, header)
        if kind == "loop" and STAGED_FILES in header:
            header = await self._keep_loop_checkpoint(sub, header)
        if kind == "sync" and isinstance(blob, ray.ObjectRef):
            blob = StoredBlob(blob, int(header.get("blob_bytes", 0)))
        report_message(self.listener, assignment, header, blob)

    async def _keep_save(self, sub: ActorSubJob, header: dict[str, Any]) -> dict[str, Any]:
        """Write a save's files, sent from the host, where the service expects them (checkpoint_transfer.py)."""
        header = dict(header)
        files = header.pop(STAGED_FILES)
        request_id = header["request_id"]
        directory = sub.saves.pop(request_id, None)
        manifest = (header.get("result") or {}).get("manifest") or {}
        try:
            if directory is None:
                raise TransferError("the head did not expect this save")
            await asyncio.to_thread(write_checkpoint_files, directory, files, manifest)
        except (TransferError, OSError) as exc:
            return messages.encode(
                messages.failed(
                    request_id,
                    "operation_failed",
                    f"save failed: the checkpoint written on host {sub.host.name} could not be kept: {exc}",
                )
            )
        return header

    async def _keep_loop_checkpoint(self, sub: ActorSubJob, header: dict[str, Any]) -> dict[str, Any]:
        """A managed loop's checkpoint, written on the host: its files go where the service adopts it from."""
        header = dict(header)
        files = header.pop(STAGED_FILES)
        directory = Path(header["directory"])

        def write() -> None:
            directory.parent.mkdir(parents=True, exist_ok=True)
            write_checkpoint_files(directory, files, header.get("manifest") or {})

        try:
            await asyncio.to_thread(write)
        except (TransferError, OSError) as exc:  # the service then finds no files and says it kept nothing
            log.warning(
                "checkpoint %s of %s from host %s could not be kept: %s",
                header.get("checkpoint_id"),
                sub.assignment.job_id,
                sub.host.name,
                exc,
            )
        return header

    async def _actor_died(self, sub: ActorSubJob, exc: Exception, rank: int = 0) -> None:
        if sub.stopping:
            return
        alive = await asyncio.to_thread(node_is_alive, sub.host.node_id)
        if sub.stopping:
            return
        if not alive:  # the whole host is gone: let the service hear of it first (see _refresh_hosts)
            await self._refresh_hosts()
            if not sub.stopping:
                self._fail(sub, "host_lost", _host_lost_message(sub))
        else:
            self._fail(sub, "worker_crashed", self._died_message(sub, rank, _reason(exc), actor=True))

    @staticmethod
    def _died_message(sub: ActorSubJob, rank: int, reason: str, actor: bool = False) -> str:
        """Why a sub-job failed `worker_crashed`: its worker (or its Ray actor) died; for a rank group, which."""
        if sub.group is not None:
            pid = sub.placements[rank].get("pid") if rank < len(sub.placements) else None
            return sub.group.crash_message(rank, pid, reason, f" on host {sub.host.name}")
        if actor:
            return (
                f"the Ray actor serving {sub.assignment.sub_job_id} on host {sub.host.name}"
                f" died ({reason}); see the job's logs. Other jobs are unaffected."
            )
        return (
            f"the worker serving {sub.assignment.sub_job_id} on host {sub.host.name} stopped"
            f" ({reason}); see the job's logs. Other jobs are unaffected."
        )

    def _fail(self, sub: ActorSubJob, code: str, message: str) -> None:
        key = (sub.assignment.job_id, sub.assignment.sub_job_id)
        if self._sub_jobs.get(key) is sub:
            del self._sub_jobs[key]
        sub.stopping = True
        self._release(sub)
        self.listener.sub_job_failed(sub.assignment.job_id, sub.assignment.sub_job_id, code, message)

    def _spawn(self, coroutine: Any) -> asyncio.Task:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


def _host_lost_message(sub: ActorSubJob) -> str:
    return (
        f"host {sub.host.name} left the cluster (its Ray node is gone) while it served {sub.assignment.sub_job_id};"
        " create a new job (and load a checkpoint, if you saved one). Other jobs are unaffected."
    )


def _reason(exc: Exception) -> str:
    """A short why from Ray's error: the worker's exit detail when Ray gives one, without its advice."""
    text = " ".join(str(exc).split())
    if "Worker exit detail: " in text:
        text = text.split("Worker exit detail: ", 1)[1]
    elif "The actor died because " in text:
        text = "died because " + text.split("The actor died because ", 1)[1]
    text = text.split(" Some common causes", 1)[0]
    return (text[:240] + "...") if len(text) > 240 else (text or type(exc).__name__)
