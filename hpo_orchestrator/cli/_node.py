"""What one Slurm job runs: one orchestrator on the GPUs Slurm gave the job.

The CLI's own payload, handed to ``cluster.submit`` as a function (submitit takes one), so that
cluster/ knows nothing of the CLI. Pickled by submitit on the submitting machine and called on
the node. Slurm's GRES plugin has
set ``CUDA_VISIBLE_DEVICES`` to the job's GPUs, as indices of the node's GPU device files
(gres.conf ``File=``), whose order is the driver's minor numbers, in practice PCI bus order;
so indices are read with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` unless the job says otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import submitit

__all__ = ["NodeRun"]


class NodeRun(submitit.helpers.Checkpointable):
    """``hpo-orchestrator run OVERRIDES`` inside the job.

    Checkpointable: when Slurm signals a time limit or preemption (submitit asks for USR2
    ahead of it), submitit requeues the same call, and the requeued job resumes the study.
    A plain scancel sends SIGTERM: the orchestrator stops its trials (``interrupted``).
    """

    def __init__(self, main: Callable[[Sequence[str]], int], overrides: list[str],
                 gpus_per_node: int) -> None:
        self.main = main  # the CLI's entry, pickled by reference: the node imports it
        self.overrides = overrides
        self.gpus_per_node = gpus_per_node

    def __call__(self, index: int) -> int:
        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        if self.gpus_per_node == 0:
            # a CPU job: a CUDA_VISIBLE_DEVICES carried over from the submitting shell is not ours
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
        code = self.main(["run", *self.overrides])
        if code != 0:
            raise RuntimeError(f"hpo-orchestrator run exited with {code} (job task {index}); "
                               "see this job's log above")
        return code
