"""The processes of a run, as the tying engine (`hf_layertie.engine`) needs them: the collectives seam.

A tying decision is made on the main process and taken on every process at the same step, so the engine needs a
handful of collectives: the main process's decision on every process (`broadcast`), a number of every process
(`gather`, `mean`), and strategy work that fails on every process together when it fails on one
(`on_every_process`). They live here, behind one small class, so that the engine does not depend on who launched
the processes: `AcceleratorProcesses` serves `TyingTrainer` (the Trainer's `accelerate.Accelerator`),
`DistributedProcesses` a plain loop under torchrun (`torch.distributed`), and `Processes` itself a single process.
With one process, every method returns at once without a collective, whichever the class.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
from accelerate.utils import broadcast_object_list, gather_object

T = TypeVar("T")


class Processes:
    """A single process: every collective is its own value. Subclasses supply the collectives of several processes
    (`_broadcast`, `_gather`, `_mean`, `_gather_objects`), called only when there is more than one.

    Args:
        device: where the tensors of the collectives live (the processes' device: NCCL reduces CUDA tensors only);
            on a CUDA device, `synchronize` waits for the queued kernels.
    """

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)

    @property
    def num_processes(self) -> int:
        return 1

    @property
    def process_index(self) -> int:
        return 0

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    def broadcast(self, obj: T) -> T:
        """The main process's `obj` on every process (collective)."""
        if self.num_processes == 1:
            return obj
        return self._broadcast(obj)

    def gather(self, value: float) -> list[float]:
        """`value` of every process, by rank (collective)."""
        if self.num_processes == 1:
            return [value]
        return self._gather(value)

    def mean(self, value: float) -> float:
        """The mean of `value` over processes (collective)."""
        if self.num_processes == 1:
            return value
        return self._mean(value)

    def on_every_process(self, compute: Callable[[], T], step: int) -> T:
        """`compute()`, strategy work that every process runs at the same `step` (collective). Should it raise on any
        process, every process raises: that one with its error, the others naming it. Otherwise the others would wait
        in the next collective, which the failed one never joins; a launcher that does not end them (a bare
        torch.distributed launch) leaves them hanging. A strategy's own collectives come before anything that can
        raise on one process alone."""
        if self.num_processes == 1:
            return compute()
        error = None
        try:
            result = compute()
        except Exception as raised:
            error = raised
        failures = self._gather_objects(None if error is None else f"{type(error).__name__}: {error}")
        if error is not None:
            raise error
        failed = [(rank, failure) for rank, failure in enumerate(failures) if failure is not None]
        if failed:
            rank, failure = failed[0]
            raise RuntimeError(
                f"Process {rank} stopped at step {step} with {failure}; process "
                f"{self.process_index} stops with it (the traceback is in process {rank}'s output)"
            )
        return result

    def synchronize(self) -> None:
        """Wait for the kernels queued on the device (a no-op off CUDA): timings start and end with the work they time."""
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    # The collectives of several processes.

    def _broadcast(self, obj: T) -> T:
        raise NotImplementedError

    def _gather(self, value: float) -> list[float]:
        raise NotImplementedError

    def _mean(self, value: float) -> float:
        raise NotImplementedError

    def _gather_objects(self, obj: Any) -> list[Any]:
        """`obj` of every process, by rank."""
        raise NotImplementedError


class AcceleratorProcesses(Processes):
    """The processes of an `accelerate.Accelerator`, read when asked: the Trainer builds a new accelerator for each
    hyperparameter-search trial, so `accelerator` is a callable returning the one in use."""

    def __init__(self, accelerator: Callable[[], Any], device: torch.device | str):
        super().__init__(device)
        self._accelerator = accelerator

    @property
    def num_processes(self) -> int:
        return self._accelerator().num_processes

    @property
    def process_index(self) -> int:
        return self._accelerator().process_index

    def _broadcast(self, obj: T) -> T:
        return broadcast_object_list([obj], from_process=0)[0]

    def _gather(self, value: float) -> list[float]:
        tensor = torch.tensor([value], dtype=torch.float64, device=self.device)
        return self._accelerator().gather(tensor).tolist()

    def _mean(self, value: float) -> float:
        return float(self._accelerator().reduce(torch.tensor(value, device=self.device), "mean"))

    def _gather_objects(self, obj: Any) -> list[Any]:
        return gather_object([obj])


class DistributedProcesses(Processes):
    """The processes of the default `torch.distributed` process group (a plain loop under torchrun), which must be
    initialised before the first collective."""

    @property
    def num_processes(self) -> int:
        return torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1

    @property
    def process_index(self) -> int:
        return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0

    def _broadcast(self, obj: T) -> T:
        objects = [obj]
        torch.distributed.broadcast_object_list(objects, src=0)
        return objects[0]

    def _gather(self, value: float) -> list[float]:
        return [float(each) for each in self._gather_objects(value)]

    def _mean(self, value: float) -> float:
        tensor = torch.tensor(value, dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(tensor)
        return float(tensor) / self.num_processes

    def _gather_objects(self, obj: Any) -> list[Any]:
        gathered = [None] * self.num_processes
        torch.distributed.all_gather_object(gathered, obj)
        return gathered
