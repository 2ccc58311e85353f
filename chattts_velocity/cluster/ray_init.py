"""The Ray cluster a driver runs on: join one at an address, or start a private loopback-only one.

Ray is imported inside functions only: the loopback environment must be set before the first `import ray`.
"""
from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..chat import Chat

# A private local cluster must stay on loopback: Ray otherwise advertises and binds the machine's
# network address (ray.init(_node_ip_address="127.0.0.1") is silently rewritten). Read at `import ray`.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0",
                "RAY_AUTH_MODE": "disabled"}
LOOPBACK = "127.0.0.1"


def init_ray(address: str | None = None, num_cpus: float | None = None, object_store_mb: int | None = 256,
             temp_dir: str | None = None, log_to_driver: bool = False) -> dict[str, Any]:
    """Join the cluster at `address` ("auto", "host:6379", "ray://..."), or start a private local one.

    The local cluster is loopback-only (every Ray listener on 127.0.0.1), has no dashboard, and
    caps the object store (MiB; Ray's default is 30 % of RAM). Returns ray.init's address_info.
    Does nothing when Ray is already initialised (so library calls never start a second cluster).
    """
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        ray = sys.modules["ray"]
        return {"node_ip_address": ray.util.get_node_ip_address(), "gcs_address": ray.get_runtime_context().gcs_address}
    if address is None:
        _set_loopback_env()
    import ray

    info: dict[str, Any]  # ray.init's context types address_info as Any
    if address is not None:
        info = ray.init(address=address, log_to_driver=log_to_driver).address_info
        return info
    store = None if object_store_mb is None else int(object_store_mb * 2**20)
    info = ray.init(num_cpus=num_cpus, include_dashboard=False, object_store_memory=store, _temp_dir=temp_dir,
                    log_to_driver=log_to_driver).address_info
    if info["node_ip_address"] != LOOPBACK:
        ray.shutdown()
        raise RuntimeError(f"ray: the local cluster came up on {info['node_ip_address']}, not {LOOPBACK}; "
                           "start it before anything imports ray, or set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0")
    return info


def _set_loopback_env() -> None:
    for key, value in LOOPBACK_ENV.items():
        os.environ.setdefault(key, value)
    if "ray" in sys.modules:  # too late to set the variable: it is read when ray is imported
        from ray._private import ray_constants

        if ray_constants.ENABLE_RAY_CLUSTER:
            raise RuntimeError("ray: it was imported before RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 was set, so a "
                               "local cluster would listen on the network; call init_ray() before importing ray")


def load_worker_chat(model_dir: str, verify: bool = True, **load_kwargs: Any) -> Chat:
    """The velocity-engine Chat inside a replica or actor (the folder must exist on every node)."""
    from ..chat import Chat

    chat = Chat()
    chat.load(source="custom", custom_path=model_dir, verify=verify, use_vllm=True, **load_kwargs)
    return chat
