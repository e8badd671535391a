"""Every INT8 test starts from the same seed (the ``checkpoints`` fixture is the repository's)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
