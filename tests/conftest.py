import sys
from pathlib import Path

import pytest
import torch
from transformers import BertConfig, BertForMaskedLM, ModernBertConfig, ModernBertForMaskedLM

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


def tiny_masked_lm(kind):
    torch.manual_seed(0)
    if kind == "bert":
        cfg = BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=256)
        model = BertForMaskedLM(cfg)
    else:
        cfg = ModernBertConfig(
            vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=256, pad_token_id=0, eos_token_id=EOS_ID, bos_token_id=1, cls_token_id=1, sep_token_id=2,
        )
        model = ModernBertForMaskedLM(cfg)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return model.eval()


@pytest.fixture(scope="session")
def models(stand_in_models):
    """Every family's tiny model: the remote-code stand-ins plus real transformers masked LMs."""
    out = dict(stand_in_models)
    out["bert"] = tiny_masked_lm("bert")
    out["modernbert"] = tiny_masked_lm("modernbert")
    return out
