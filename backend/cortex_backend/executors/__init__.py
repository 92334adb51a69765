"""What runs sub-jobs: the `Executor` interface and its rules for a worker's environment (base.py,
environment.py), worker processes on this host (local.py), Ray actors on the hosts of a cluster (ray_cluster/),
and the choice between them (choice.py)."""
