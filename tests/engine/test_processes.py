"""The collectives seam of the tying engine (`hf_layertie.engine.processes`): one process runs no collective, and two
gloo processes (torchrun) agree on each, a failure on one rank raising on both."""

import pytest
from helpers.processes import run_on_two_ranks

from hf_layertie.engine import AcceleratorProcesses, DistributedProcesses, Processes


class OneProcessAccelerator:
    """An accelerator of one process whose collectives must not be called."""

    num_processes = 1
    process_index = 0

    def gather(self, tensor):
        raise AssertionError("a collective with one process")

    reduce = gather


@pytest.mark.parametrize(
    "processes",
    [Processes(), DistributedProcesses(), AcceleratorProcesses(lambda: OneProcessAccelerator(), "cpu")],
    ids=["single", "torch.distributed uninitialised", "accelerator"],
)
def test_one_process_returns_its_own_values_without_a_collective(processes):
    assert (processes.num_processes, processes.process_index, processes.is_main_process) == (1, 0, True)
    message = object()
    assert processes.broadcast(message) is message
    assert processes.gather(2.5) == [2.5]
    assert processes.mean(2.5) == 2.5
    assert processes.on_every_process(lambda: "done", step=1) == "done"
    with pytest.raises(ValueError, match="its own error"):
        processes.on_every_process(lambda: (_ for _ in ()).throw(ValueError("its own error")), step=1)
    processes.synchronize()


def test_two_processes_agree_and_a_failure_on_one_stops_both(tmp_path):
    rank0, rank1 = run_on_two_ranks("processes_run.py", tmp_path, timeout=300)
    for rank, measured in enumerate((rank0, rank1)):
        assert measured["num_processes"] == 2
        assert measured["is_main_process"] == (rank == 0)
        assert measured["broadcast"] == "from rank 0"
        assert measured["gather"] == [0.5, 1.5]
        assert measured["mean"] == 0.5
        assert measured["computed"] == rank * 10
    assert rank1["failure"] == "ValueError: no map"
    assert rank0["failure"] == (
        "RuntimeError: Process 1 stopped at step 7 with ValueError: no map; process 0 stops with it "
        "(the traceback is in process 1's output)"
    )
