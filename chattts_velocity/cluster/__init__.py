"""Joining or starting a Ray cluster, and loading a Chat inside one of its workers (the [ray] extra).

Shared by the server's replicas (serve/ray_serve.py) and the batch export's actors (export/ray.py); importing
this package imports no ray, so init_ray() can set the loopback environment first.
"""
from chattts_velocity.cluster.ray_init import LOOPBACK, LOOPBACK_ENV, init_ray, load_worker_chat

__all__ = ["LOOPBACK", "LOOPBACK_ENV", "init_ray", "load_worker_chat"]
