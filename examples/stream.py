"""Stream a generation to the terminal with transformers' TextStreamer: the engine hands the streamer the
prompt, then each block as soon as it is final (diffusion decoding finishes a block at a time, not a token).

    python examples/stream.py --backbone GSAI-ML/LLaDA-8B-Instruct --trust-remote-code
    python examples/stream.py --head heads/sdar-1.7b-chat-mrp --trust-remote-code --mode speculative
    python examples/stream.py --tiny          # the bundled reference model, CPU, seconds (see _tiny.py)
"""

from __future__ import annotations

import argparse
import os

import torch
from transformers import AutoTokenizer, TextStreamer

import mrp_hf


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backbone", default="GSAI-ML/LLaDA-8B-Instruct", help="Hub id or folder of the DLM")
    parser.add_argument("--head", default=None, help="optional MRP head (needed by --mode speculative/remask/direct)")
    parser.add_argument("--mode", choices=["off", "speculative", "remask", "direct"], default="off")
    parser.add_argument("--threshold", type=float, default=None, help="dynamic decoding (and remask) threshold")
    parser.add_argument("--prompt", default="Explain in three sentences why the sky is blue.")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="0: the model's generation_config.json")
    parser.add_argument("--block-length", type=int, default=32, help="0: the model's own")
    parser.add_argument("--trust-remote-code", action="store_true", help="run the model repo's own Python code")
    parser.add_argument("--tiny", action="store_true", help="the bundled reference model (or MRP_EXAMPLES_TINY=1)")
    args = parser.parse_args()
    if args.tiny or os.environ.get("MRP_EXAMPLES_TINY", "") not in ("", "0"):
        from _tiny import tiny_paths, tiny_prompts  # examples/_tiny.py: only the tiny path needs it

        args.backbone, args.head = tiny_paths()
        # the reference model's own answer length and block (its generation_config.json)
        args.prompt, args.max_new_tokens, args.block_length, args.mode = tiny_prompts(1)[0], 0, 0, "speculative"
    return args


def main() -> int:
    args = parse_args()
    load = {"trust_remote_code": args.trust_remote_code}
    if torch.cuda.is_available():
        load.update(torch_dtype=torch.bfloat16, device_map="auto")
    if args.head:  # backbone + head (the backbone given here, checked against the head)
        backbone = mrp_hf.load_backbone(args.backbone, **load)
        model = mrp_hf.MRPModel.from_pretrained(args.head, backbone=backbone)
        args.block_length = model.head.config.block_length or args.block_length  # the block it was trained with
    else:  # the backbone's own static / dynamic decoding
        model = mrp_hf.MRPModel.from_backbone_pretrained(args.backbone, **load)
    tokenizer = AutoTokenizer.from_pretrained(args.backbone, trust_remote_code=args.trust_remote_code)

    chat = bool(getattr(tokenizer, "chat_template", None))
    text = (
        tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}], add_generation_prompt=True, tokenize=False)
        if chat
        else args.prompt
    )
    batch = tokenizer([text], return_tensors="pt", add_special_tokens=not chat).to(model.device)

    # The streamer takes one prompt at a time (batch size 1). skip_prompt: print only the answer.
    streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    lengths = {}  # unset (0): the model's generation_config.json says
    if args.block_length:
        lengths["block_length"] = args.block_length
    if args.max_new_tokens:
        block = args.block_length or 1
        lengths["max_new_tokens"] = -(-args.max_new_tokens // block) * block
    out = model.generate(
        batch["input_ids"], attention_mask=batch["attention_mask"], streamer=streamer, threshold=args.threshold,
        mrp_mode=args.mode, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        return_dict_in_generate=True, **lengths,
    )
    print(f"\nstreamed {sum(out.stats.row_new_tokens)} tokens in {out.stats.backbone_forwards} backbone forwards "
          f"({out.stats.head_forwards} head forwards)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
