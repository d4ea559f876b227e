"""Ray Train's elastic scaling policy, resizing by whole context-parallel groups.

An elastic run (``scaling.num_workers: [min, max]``) lets Ray Train pick any worker count in the range that the
cluster's free resources allow. With ``scaling.context_parallel: N`` each sequence is split over N ranks, so a
group of 3 workers at N=2 cannot form the data x context mesh. Ray has no public switch for the sizes it may pick;
its own policy rounds down the same way for multi-host TPU slices (``_get_strict_tpu_worker_count``). This subclass
rounds the count it would pick down to a multiple of N; the config checks that both ends of the range are
multiples. Written against Ray's private ``ElasticScalingPolicy`` (the controller actor unpickles this class, so it
lives in an importable module): ``ray_launcher`` refuses CP with an elastic range when that class is not there,
rather than start a group it cannot use.
"""

from __future__ import annotations

from ray.train.v2._internal.execution.scaling_policy.elastic import ElasticScalingPolicy
from ray.train.v2._internal.execution.scaling_policy.fixed import FixedScalingPolicy


class WholeGroupsPolicy(ElasticScalingPolicy):
    """Ray Train's elastic policy, its worker counts rounded down to a multiple of ``group``."""

    def __init__(self, scaling_config, group: int):
        super().__init__(scaling_config)
        self.group = group

    def _count_possible_workers(self, reserved_resources) -> int:
        n = super()._count_possible_workers(reserved_resources)
        return n - n % self.group


class LocalFixedPolicy(FixedScalingPolicy):
    """A fixed-size run on the local Ray this driver started: Ray Train's policy without its autoscaling
    coordinator. The coordinator is one more actor process (its runtime wakes 100 times a second: ~0.7% of a core,
    and ~0.2 GiB) that forwards resource requests to a cluster autoscaler, which a local Ray does not have."""

    def after_controller_start(self, train_run_context) -> None:
        return None

    def _maybe_send_resource_request(self) -> None:
        return None

    def _send_resource_request(self) -> None:
        return None

    def _cancel_resource_request(self) -> None:
        return None
