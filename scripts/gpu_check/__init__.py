"""scripts/gpu-check: what a lent GPU host must show before anything else runs on it (see main.py)."""
