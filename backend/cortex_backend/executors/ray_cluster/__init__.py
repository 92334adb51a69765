"""The Ray executor: one backend (Tornado, SQLite, tokens, logs, the checkpoint index) on the head, sub-jobs
as Ray actors on every host that joins. Imported only when `--executor ray` is chosen; needs
`pip install 'cortex-nb[ray]'`.

    executor.py             RayExecutor: the `Executor` interface over Ray actors
    sub_job_actor.py        the actor: the local executor's worker code, fed through queues
    output_capture.py       an actor's stdout/stderr as the sub-job's log lines
    checkpoint_transfer.py  checkpoints written on a host, kept in the head's data dir
    hosts.py                which hosts are up, their devices and models
    registry.py             what the head and each host publish in Ray's key-value store
    host_monitor.py         device samples read on each host
    head.py                 starting and stopping the Ray head the backend owns
    join.py                 `cortex-nb host join`: a host joins the head's cluster
    versions.py             the versions a host must share with the head
"""
