"""Make a tiny random-weight Llama and a byte-level BPE tokenizer for vLLM to serve.

Run with the vLLM venv's Python (it has ``torch``, ``transformers`` and ``tokenizers``):

    $SWITCHYARD_VLLM_VENV/bin/python tests/vllm/make_tiny_model.py DIR

Nothing is downloaded: the tokenizer is trained on this repository's own text (docs and
sources), the weights are random (seeded). The answers are gibberish; what the tests need
is a real engine: real tokenization, a chat template, prefix caching, metrics. A model of
this size starts in seconds on a CPU and keeps RAM use small.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VOCAB_SIZE = 4096
SPECIAL = ["<|pad|>", "<|bos|>", "<|eos|>"]
# The same shape as the gateway's rendering (gateway/prompt_render.py), so its byte
# offsets and the model's token offsets move together.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{{ part['text'] }}{% endfor %}{% endif %}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def corpus() -> list[str]:
    """Local text to train the tokenizer on: the repository's docs and Python sources."""
    texts = []
    for pattern in ("*.md", "docs/*.md", "gateway/**/*.py", "local_backend/**/*.py", "tests/**/*.py"):
        for path in sorted(ROOT.glob(pattern)):
            texts.append(path.read_text(encoding="utf-8", errors="replace"))
    if not texts:
        raise SystemExit(f"no text found under {ROOT} to train the tokenizer on")
    return texts


def make_tokenizer(out: Path) -> int:
    """Train and save the tokenizer; returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<|pad|>", bos_token="<|bos|>", eos_token="<|eos|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return int(tok.get_vocab_size())


def make_model(out: Path, vocab_size: int) -> None:
    """Save a 2-layer Llama with random (seeded) weights."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}), encoding="utf-8"
    )


def main() -> int:
    """``make_tiny_model.py DIR``: write the model and tokenizer to DIR (marked complete last)."""
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    (out / ".complete").unlink(missing_ok=True)
    vocab = make_tokenizer(out)
    make_model(out, vocab)
    (out / ".complete").write_text("ok\n", encoding="utf-8")
    print(f"tiny model (vocab {vocab}) in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
