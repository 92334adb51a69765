"""Compatibility faces: other clients' APIs served by the same backend.

Each face is a folder of handlers plus its own codec. It calls the service methods our own handlers call and
adds no engine, store or scheduler of its own, so what it creates are ordinary jobs, requests and checkpoints.
"""
