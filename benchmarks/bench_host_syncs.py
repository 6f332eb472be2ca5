"""Host synchronisations per backbone forward of each decoding mode, on the bundled reference DLM + head.

    python benchmarks/bench_host_syncs.py [--batch 1] [--per-task 4]

Counts every read of a tensor's value by Python during generate (`mrp_hf.generation.host_syncs`): on a GPU each
one stalls the pipeline until the device catches up. Prints one JSON row per mode: total reads by kind, backbone
forwards, and reads per forward. The count is exact and does not depend on machine load.
"""

from __future__ import annotations

import argparse
import json

import torch

from mrp_hf.generation.host_syncs import count_host_syncs
from mrp_hf.reference import bundled, held_out_items

MODES = {
    "static": {},
    "dynamic:0.5": {"threshold": 0.5},
    "speculative:3": {"mrp_mode": "speculative", "mrp_draft_tokens": 3},
    "remask:0.5": {"mrp_mode": "remask", "threshold": 0.5},
    "direct:2": {"mrp_mode": "direct", "mrp_draft_tokens": 2},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--per-task", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tokenizer = bundled.load_reference(with_head=True)
    tokenizer.padding_side = "left"
    prompts = [item.prompt for item in held_out_items(per_task=args.per_task)]
    for name, kwargs in MODES.items():
        totals, forwards = {}, 0
        for i in range(0, len(prompts), args.batch):
            batch = tokenizer(prompts[i : i + args.batch], return_tensors="pt", padding=True, add_special_tokens=False)
            with count_host_syncs() as counts:
                out = model.generate(batch["input_ids"], attention_mask=batch["attention_mask"],
                                     return_dict_in_generate=True, **kwargs)
            forwards += out.stats.backbone_forwards
            for key, value in counts.items():
                totals[key] = totals.get(key, 0) + value
        reads = sum(totals.values())
        print(json.dumps({"mode": name, "batch": args.batch, "backbone_forwards": forwards, "reads": reads,
                          "reads_per_forward": round(reads / forwards, 2), "by_kind": dict(sorted(totals.items()))}))


if __name__ == "__main__":
    main()
