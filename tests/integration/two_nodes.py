"""A simulated 2-node Ray cluster (1 CPU each) for the scripts that test_multinode.py runs in their own process."""

import contextlib

import ray
from ray.cluster_utils import Cluster


@contextlib.contextmanager
def two_node_cluster():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
