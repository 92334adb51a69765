"""Ray's own command line (`ray start ...`), except that a loopback address stays loopback.

Ray swaps 127.0.0.1 for the machine's outward address wherever it is given (the head's address, this
node's address), so a node joining a head that listens on loopback only would look for it where it does
not listen, and would itself listen on every interface. confinement.py says why the head listens on
loopback; this keeps the joining node there too. Any other address passes through unchanged.

    python -m cortex_backend.executors.ray_cluster.ray_cli start --address 127.0.0.1:PORT ...
"""

from __future__ import annotations


def keep_loopback_addresses() -> None:
    from ray._private import services

    swap = services.resolve_ip_for_localhost

    def resolve(host: str) -> str:
        return services.get_localhost_ip() if services.is_localhost(host) else swap(host)

    services.resolve_ip_for_localhost = resolve


def main() -> None:
    keep_loopback_addresses()
    from ray.scripts.scripts import main as ray_main

    ray_main()


if __name__ == "__main__":
    main()
