"""Train an MRP head for a LoRA-adapted backbone (PEFT), and load it back as base model + adapter + head.

The head learns the dynamics of the backbone it is trained on, so for a fine-tuned backbone train it on the
adapted model, not on the base. Its config then records both the base model and the adapter
(`peft_adapter_id`), and `MRPModel.from_pretrained(head)` rebuilds exactly that stack.

    python examples/train_head_lora.py --backbone GSAI-ML/LLaDA-8B-Instruct --adapter <you>/<llada-lora> \
        --dataset chat.jsonl --output heads/llada-lora-mrp --trust-remote-code
    python examples/train_head_lora.py --tiny          # the bundled reference model, CPU, seconds (see _tiny.py)

Why not merge the adapter first (`merge_and_unload()`)? A merged copy has no id of its own to record, so the
head could only name the base model, and `from_pretrained(head)` would load the backbone without the adapter.
Train on the merged copy only if you also save it and pass that folder as --backbone.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model

import mrp_hf
from mrp_hf.training import MRPTrainingConfig, train_head


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backbone", default="GSAI-ML/LLaDA-8B-Instruct", help="the base model (Hub id or folder)")
    parser.add_argument("--adapter", help="PEFT adapter id or folder, trained on --backbone (required unless --tiny)")
    parser.add_argument("--dataset", help="JSONL file (required unless --tiny)")
    parser.add_argument("--output", default="heads/llada-8b-instruct-lora-mrp")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--trust-remote-code", action="store_true", help="run the model repo's own Python code")
    parser.add_argument("--tiny", action="store_true", help="the bundled reference model (or MRP_EXAMPLES_TINY=1)")
    args = parser.parse_args()
    args.tiny = args.tiny or os.environ.get("MRP_EXAMPLES_TINY", "") not in ("", "0")
    if args.tiny:
        from _tiny import tiny_dataset, tiny_paths  # examples/_tiny.py: only the tiny path needs it

        args.backbone, _ = tiny_paths()
        work = Path(tempfile.mkdtemp(prefix="mrp-example-"))
        args.output, args.steps = str(work / "head"), 3
        args.adapter = args.adapter or make_random_lora(args.backbone, work / "adapter")
        args.dataset = args.dataset or tiny_dataset(work, samples=64)
    elif not (args.adapter and args.dataset):
        parser.error("--adapter and --dataset are required (see the docstring)")
    return args


def make_random_lora(backbone: str, folder: Path) -> str:
    """Stand-in for a real fine-tune in tiny mode: a LoRA adapter with random (non-zero) weights."""
    base = mrp_hf.load_backbone(backbone)
    torch.manual_seed(0)
    lora = get_peft_model(base, LoraConfig(r=4, target_modules=["qkv_proj", "o_proj"], init_lora_weights=False))
    lora.save_pretrained(folder)
    return str(folder)


def main() -> int:
    args = parse_args()
    gpu = torch.cuda.is_available()
    dtype = torch.bfloat16 if gpu else torch.float32

    # 1. Base model + adapter, in memory. The adapter stays unmerged (and frozen, like the base).
    base = mrp_hf.load_backbone(args.backbone, trust_remote_code=args.trust_remote_code, torch_dtype=dtype)
    adapted = PeftModel.from_pretrained(base, args.adapter)

    # 2. Train on the adapted model. `peft_adapter_id` (an MRPConfig field) goes into the head's config, next to
    #    the base model id, which train_head reads from the backbone's config (`_name_or_path`).
    config = MRPTrainingConfig(
        max_steps=args.steps, batch_size=4 if args.tiny else 2, grad_accum=1 if args.tiny else 8,
        max_length=64 if args.tiny else 2048, num_hidden_layers=1 if args.tiny else 3,
        chat_template=not args.tiny, mixed_precision="bf16" if gpu else "no", disable_progress=args.tiny,
        eval_every=max(1, args.steps // 4),
    )
    head = train_head(adapted, args.dataset, args.output, tokenizer=args.backbone, config=config,
                      peft_adapter_id=args.adapter)
    print(f"head config: base model {head.config.base_model_name_or_path!r}, adapter {head.config.peft_adapter_id!r}")

    # 3. Load it back from the head folder alone: base model, then the adapter, then the head (checked).
    model = mrp_hf.MRPModel.from_pretrained(args.output, trust_remote_code=args.trust_remote_code,
                                            **({"torch_dtype": dtype, "device_map": "auto"} if gpu else {}))
    assert isinstance(model.backbone, PeftModel)

    # 4. Decode: speculative decoding gives the adapted model's own static decoding, token for token.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.backbone, trust_remote_code=args.trust_remote_code)
    if args.tiny:
        from _tiny import tiny_prompts

        prompt = tiny_prompts(1)[0]
    else:
        prompt = "Give me three facts about owls."
    batch = tokenizer([prompt], return_tensors="pt")
    block = head.config.block_length
    kwargs = dict(attention_mask=batch["attention_mask"], block_length=block, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id)
    if not args.tiny:  # tiny: the reference model's own answer length (its generation_config.json)
        kwargs["max_new_tokens"] = 4 * block
    static = model.generate(batch["input_ids"], **kwargs)
    fast = model.generate(batch["input_ids"], mrp_mode="speculative", **kwargs)
    print(f"LoRA backbone + head: speculative identical to static: {torch.equal(static, fast)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
