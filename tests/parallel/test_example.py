"""examples/train_ddp.py under torchrun trains exactly like one process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

EXAMPLE = Path(__file__).parents[2] / "examples" / "train_ddp.py"
ARGS = ["--steps", "4", "--width", "32", "--layers", "2", "--batch-size", "4"]
ARGS += ["--seq-len", "32", "--log-every", "1", "--max-bytes", str(2**16)]


def _losses(command: list[str]) -> list[float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    run = subprocess.run(
        command + ARGS, env=env, capture_output=True, text=True, timeout=240
    )
    assert run.returncode == 0, run.stdout + run.stderr
    losses = [float(x) for x in re.findall(r"loss (\d+\.\d+)", run.stdout)]
    assert len(losses) == 5, run.stdout  # four training steps and validation
    return losses


def test_torchrun_two_processes_train_like_one() -> None:
    one = _losses([sys.executable, str(EXAMPLE)])
    assert one[3] < one[0]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    for flags in [[], ["--fsdp"]]:  # DDP, FSDP2
        two = _losses([*torchrun, "--nproc_per_node=2", str(EXAMPLE), *flags])
        assert two == pytest.approx(one, abs=2e-4), flags
