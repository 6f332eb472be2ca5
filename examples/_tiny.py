"""Tiny local models for running the examples on a CPU in seconds (`--tiny` or `MRP_EXAMPLES_TINY=1`).

The examples only import this module in tiny mode, so a script copied on its own still runs on real models.
Where the tiny models come from, first match wins:
  1. `MRP_EXAMPLES_BACKBONE` / `MRP_EXAMPLES_HEAD`: folders of a backbone (with its tokenizer) and of an MRP
     head trained or built for it (the test suite makes random ones, see tests/test_examples.py);
  2. the reference DLM and head bundled with mrp-hf (`mrp_hf.reference.bundled`), when this installation has them.
"""

from __future__ import annotations

import os
import sys


def tiny_paths() -> tuple[str, str]:
    """(backbone folder, head folder) of tiny local models; exits with a message when there are none."""
    backbone = os.environ.get("MRP_EXAMPLES_BACKBONE")
    head = os.environ.get("MRP_EXAMPLES_HEAD")
    if backbone and head:
        return backbone, head
    try:
        from mrp_hf.reference import bundled

        return backbone or str(bundled.backbone_path()), head or str(bundled.head_path())
    except (ImportError, AttributeError, FileNotFoundError) as err:
        sys.exit(
            f"tiny mode needs small local models: set MRP_EXAMPLES_BACKBONE and MRP_EXAMPLES_HEAD to a backbone folder "
            f"and a head folder (no bundled reference model in this installation: {err})"
        )
