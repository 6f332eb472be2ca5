"""Attach a local MRP head to a backbone that is already in memory (PEFT-style).

Useful when you load the backbone yourself: your own dtype / device / quantisation settings, a fine-tuned copy
in memory, or several heads tried on one loaded backbone.

    python examples/attach_head.py --head heads/sdar-1.7b-chat-mrp --trust-remote-code
    python examples/attach_head.py --tiny          # the bundled reference model, CPU, seconds (see _tiny.py)
"""

from __future__ import annotations

import argparse
import os

import torch
from transformers import AutoTokenizer

import mrp_hf


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backbone", default="JetLM/SDAR-1.7B-Chat", help="Hub id or folder of the DLM")
    parser.add_argument("--head", default="heads/sdar-1.7b-chat-mrp", help="an MRP head folder trained for it")
    parser.add_argument("--prompt", default="What is 12 * 7? Answer with the number.")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="0: the model's generation_config.json")
    parser.add_argument("--trust-remote-code", action="store_true", help="run the model repo's own Python code")
    parser.add_argument("--tiny", action="store_true", help="the bundled reference model (or MRP_EXAMPLES_TINY=1)")
    args = parser.parse_args()
    if args.tiny or os.environ.get("MRP_EXAMPLES_TINY", "") not in ("", "0"):
        from _tiny import tiny_paths, tiny_prompts  # examples/_tiny.py: only the tiny path needs it

        args.backbone, args.head = tiny_paths()
        args.prompt, args.max_new_tokens = tiny_prompts(1)[0], 0  # the reference model's own answer length
    return args


def main() -> int:
    args = parse_args()

    # 1. A backbone in memory, loaded however you like. `mrp_hf.load_backbone` picks the right Auto class and
    #    smooths over transformers 4/5 differences of the families' remote code; a plain
    #    `AutoModelForCausalLM.from_pretrained(..., trust_remote_code=True)` works as well.
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    backbone = mrp_hf.load_backbone(args.backbone, trust_remote_code=args.trust_remote_code, torch_dtype=dtype)
    if torch.cuda.is_available():
        backbone.to("cuda")
    tokenizer = AutoTokenizer.from_pretrained(args.backbone, trust_remote_code=args.trust_remote_code)
    tokenizer.padding_side = "left"

    # 2. The head: only its own weights (safetensors) and config; the embedding and lm_head are the backbone's.
    head = mrp_hf.MRPHead.from_pretrained(args.head)

    # 3a. Wrap: MRPModel.from_pretrained(head, backbone=...) checks the head against the backbone (vocab, hidden
    #     size, mask id, family, fingerprint of the embedding / lm_head weights) and raises ValueError on a
    #     mismatch; strict=False turns a fingerprint mismatch into a warning.
    model = mrp_hf.MRPModel.from_pretrained(args.head, backbone=backbone)
    # 3b. Or in place, PEFT-style: the same checks, then backbone.generate becomes the MRP generate and the
    #     wrapper is reachable as backbone.mrp. Saving the backbone afterwards does not save the head.
    mrp_hf.attach(backbone, head)

    batch = tokenizer([args.prompt], return_tensors="pt").to(model.device)
    block = head.config.block_length or 32  # the head only decodes the block length it was trained with
    kwargs = dict(
        attention_mask=batch["attention_mask"], block_length=block, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, mrp_mode="speculative", mrp_draft_tokens=3, return_dict_in_generate=True,
    )
    if args.max_new_tokens:  # else the model's generation_config.json says
        kwargs["max_new_tokens"] = -(-args.max_new_tokens // block) * block
    out_wrapped = model.generate(batch["input_ids"], **kwargs)
    out_attached = backbone.generate(batch["input_ids"], **kwargs)
    assert torch.equal(out_wrapped.sequences, out_attached.sequences)  # the same engine and head either way

    answer = tokenizer.decode(out_attached.sequences[0, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    stats = out_attached.stats
    print(f"answer: {answer!r}")
    print(
        f"attached head: backbone_forwards={stats.backbone_forwards} head_forwards={stats.head_forwards} "
        f"accepted_drafts={stats.accepted_drafts} tokens/forward={stats.mean_tokens_per_forward:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
