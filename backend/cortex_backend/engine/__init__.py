"""The torch side: model loading, LoRA, losses, training steps and sampling. Imported by workers only.

A concept split between the service and the engine is one pair of modules with one naming rule: the
service's module is the plural (it keeps and coordinates many), the engine's the singular (a worker runs
one): `checkpoints.py` / `engine/checkpoint.py`, `weight_syncs.py` / `engine/weight_sync.py`,
`training_loops.py` / `engine/training_loop.py`.
"""
