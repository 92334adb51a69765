"""Build a small real Hugging Face model directory for tests: a GPT-2 with random weights and a
byte-level BPE tokenizer trained on a few lines, saved as safetensors, as a user's model would be."""

from __future__ import annotations

import json
from pathlib import Path

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a model registered from a local directory loads from safetensors only",
    "lora adapters train fast and export to peft",
    "0123456789 + - * / = ( ) . , ; : ! ?",
]


def build_gpt2_dir(path: Path, seed: int = 7) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel

    path.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(CORPUS * 20, trainer)
    tokenizer.save(str(path / "tokenizer.json"))
    eos = tokenizer.token_to_id("<|endoftext|>")
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": "<|endoftext|>",
                "eos_token": "<|endoftext|>",
                "model_max_length": 256,
                "tokenizer_class": "GPT2Tokenizer",
            }
        )
    )
    config = GPT2Config(
        vocab_size=tokenizer.get_vocab_size(),
        n_positions=256,
        n_embd=64,
        n_layer=2,
        n_head=4,
        bos_token_id=eos,
        eos_token_id=eos,
    )
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config)
    model.save_pretrained(str(path), safe_serialization=True)
    return path


def _write_bpe_tokenizer(path: Path, model_max_length: int) -> tuple[int, int]:
    """A byte-level BPE tokenizer trained on CORPUS, saved in `path`: (vocabulary size, end-of-text id)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(CORPUS * 20, trainer)
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": "<|endoftext|>",
                "eos_token": "<|endoftext|>",
                "model_max_length": model_max_length,
                "tokenizer_class": "PreTrainedTokenizerFast",
            }
        )
    )
    return tokenizer.get_vocab_size(), tokenizer.token_to_id("<|endoftext|>")


def build_mixtral_dir(path: Path, seed: int = 13) -> Path:
    """A tiny Mixtral (2 layers, 4 experts, 2 per token) with random weights and a byte-level BPE tokenizer:
    an MoE base for router replay. Its routers are sharpened so a token's top experts are not near-ties."""
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    vocab_size, eos = _write_bpe_tokenizer(path, 256)
    config = MixtralConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=256,
        bos_token_id=eos,
        eos_token_id=eos,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = MixtralForCausalLM(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("gate.weight"):
                parameter.mul_(20.0)
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(str(path), safe_serialization=True)
    return path


def build_llama_dir(path: Path, seed: int = 11) -> Path:
    """A small Llama with random weights and the same kind of byte-level BPE tokenizer. Its heads are 32
    wide: vLLM's CPU attention refuses narrower ones (GPT-2 above has 16)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    vocab_size, eos = _write_bpe_tokenizer(path, 512)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=eos,
        eos_token_id=eos,
        tie_word_embeddings=False,
        rms_norm_eps=1e-5,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # a sharper head, so greedy paths are not decided by near-ties
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(str(path), safe_serialization=True)
    return path


# A Llama-shaped model with a Hugging Face tokenizer that AutoTokenizer loads (the Tinker SDK and the cookbook
# ask for tokenizers by name): small character-level vocabulary over what the arithmetic and chat examples use.
LLAMA_CORPUS = [
    "User: What is 4 + 5?\n\nAssistant: 9\n\n",
    "User: 3+4=\n\nAssistant: 7\n\n",
    "the quick brown fox jumps over the lazy dog",
    "What is the answer? Provide a numerical answer without units.",
    "0123456789 + - * / = ( ) . , ; : ! ? \\boxed{}",
]


def build_char_llama_dir(path: Path, seed: int = 11) -> Path:
    """A small Llama whose tokenizer has one token per character (tests/conftest.py's `cortex-test/tiny-llama`)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    # One token per character (no merges), so "3+4=" is four tokens and a sum has to be learned, not looked up.
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
    tokenizer.decoder = decoders.Metaspace(prepend_scheme="never")
    alphabet = sorted(
        set("".join(LLAMA_CORPUS)) | set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    )
    special = ["<s>", "</s>", "<unk>"]
    trainer = trainers.BpeTrainer(
        vocab_size=len(alphabet) + len(special), special_tokens=special, initial_alphabet=alphabet
    )
    tokenizer.train_from_iterator(LLAMA_CORPUS * 20, trainer)
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "model_max_length": 512,
                "add_bos_token": False,
            }
        )
    )
    config = LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        bos_token_id=tokenizer.token_to_id("<s>"),
        eos_token_id=tokenizer.token_to_id("</s>"),
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(str(path), safe_serialization=True)
    return path
