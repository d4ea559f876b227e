"""A simulated 2-node Ray cluster (1 CPU each) for the scripts that test_multinode.py runs in their own process."""

import contextlib

import ray
from ray.cluster_utils import Cluster


@contextlib.contextmanager
def two_node_cluster():
    # no dashboard: its port (8265) stays free for the warm cluster test_cluster.py may start meanwhile
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
