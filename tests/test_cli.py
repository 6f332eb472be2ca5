import json

from stand_ins import save_stand_in

from mrp_hf.cli import main


def test_families_lists_every_adapter(capsys):
    assert main(["families", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    families = {row["family"] for row in data["supported"]}
    assert {"llada", "dream", "sdar", "fast_dllm_v2", "llada2", "masked_lm", "generic"} <= families
    assert "diffusion_gemma" in data["refused"]


def test_generate_decodes_a_batch_from_a_local_folder(tmp_path, capsys):
    path = save_stand_in("sdar", tmp_path / "sdar")
    code = main([
        "generate", "--backbone", str(path), "--trust-remote-code", "--prompt", "a b c", "--prompt", "d",
        "--max-new-tokens", "8", "--block-length", "4", "--json",
    ])
    assert code == 0
    captured = capsys.readouterr()
    answers = [json.loads(line) for line in captured.out.strip().splitlines()]
    assert [a["prompt"] for a in answers] == ["a b c", "d"]
    stats = json.loads(captured.err.strip().splitlines()[-1])
    assert stats["backbone_forwards"] >= 2 and len(stats["row_new_tokens"]) == 2
