"""`import mrp_hf` is cheap and has no side effects on transformers until transformers itself is used."""

import subprocess
import sys


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip()


def test_import_loads_neither_torch_nor_transformers():
    out = _run("import sys, mrp_hf; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    assert out == "[]"


def test_public_names_load_on_first_use():
    out = _run("import mrp_hf; print(mrp_hf.MRPModel.__name__, mrp_hf.MRPConfig.model_type, 'MRPHead' in dir(mrp_hf))")
    assert out == "MRPModel mrp True"


def test_auto_classes_resolve_heads_and_the_reference_dlm_after_import(tmp_path):
    code = (
        "import mrp_hf\n"
        "from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM\n"
        "from mrp_hf.reference import bundled\n"
        "print(type(AutoConfig.from_pretrained(str(bundled.head_path()))).__name__,"
        " type(AutoModel.from_pretrained(str(bundled.head_path()))).__name__,"
        " type(AutoModelForMaskedLM.from_pretrained(str(bundled.backbone_path()))).__name__)\n"
    )
    assert _run(code).splitlines()[-1] == "MRPConfig MRPHead ReferenceDLM"


def test_transformers_imported_first_still_resolves():
    code = (
        "from transformers import AutoConfig\n"
        "import mrp_hf\n"
        "from mrp_hf.reference import bundled\n"
        "print(type(AutoConfig.from_pretrained(str(bundled.head_path()))).__name__)\n"
    )
    assert _run(code).splitlines()[-1] == "MRPConfig"
