import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # makes `stand_ins` importable

from stand_ins import FAMILIES, load_stand_in  # noqa: E402

STAND_IN_MASK_ID = 126
EOS_ID = 125


@pytest.fixture(scope="session")
def stand_in_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("stand_ins")


@pytest.fixture(scope="session")
def stand_in_models(stand_in_dir):
    """Each remote-code family's tiny stand-in, loaded once through trust_remote_code."""
    torch.manual_seed(0)
    return {family: load_stand_in(family, stand_in_dir) for family in FAMILIES}
