"""Build the deterministic tiny random-weight decoder the CPU default serves.

No model hub is reachable from the rig's CPU machines, so the rig writes a model directory
itself: a ``Qwen3ForCausalLM`` ``config.json``, ``model.safetensors`` and a byte-level BPE
``tokenizer.json`` trained locally with ``tokenizers``. Nothing here imports torch,
transformers or vLLM.

Why the weight scale matters: at std 0.02 such a model repeats one token whatever the
context, so a wrong KV transfer would still produce the "right" answer. At std 0.3 the
continuation depends on every prompt token, which is what makes token-exact P/D parity
(``rig.observe.parity``) a real check (measured; docs/explanation/vllm-cpu-facts.md "Serving").

The output directory name carries a hash of the recipe, so a changed recipe builds a new
model and an unchanged one is reused (``ensure_tiny_model``). The recipe itself is config
(rig.config.model.TinyModelRecipe, with its cache key); this module only builds.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from rig.config.model import TinyModelRecipe

# The tiny model's chat template: each message as "role: content" on its own line, then
# "assistant: " when a generation prompt is asked for. Without one, vLLM's /v1/chat/completions
# refuses the model (transformers >= 4.44 has no default template), and a template sent with the
# request needs --trust-request-chat-template. (rig.config.model.BUILDER_VERSION 3 carries it.)
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")


def _hf_config(r: TinyModelRecipe) -> dict:
    """The ``config.json`` vLLM reads to pick ``Qwen3ForCausalLM`` and its shapes."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": r.hidden_size,
        "intermediate_size": r.intermediate_size,
        "num_hidden_layers": r.num_hidden_layers,
        "num_attention_heads": r.num_attention_heads,
        "num_key_value_heads": r.num_key_value_heads,
        "head_dim": r.head_dim,
        "vocab_size": r.vocab_size,
        "max_position_embeddings": r.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
        "attention_bias": False,
        "torch_dtype": "float32",
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 2,
    }


def _weights(r: TinyModelRecipe) -> dict[str, np.ndarray]:
    """Random float32 weights with Qwen3's tensor names; norms are ones."""
    rng = np.random.default_rng(r.seed)

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * r.weight_std).astype(np.float32)

    h, q, kv = r.hidden_size, r.num_attention_heads * r.head_dim, r.num_key_value_heads * r.head_dim
    w: dict[str, np.ndarray] = {"model.embed_tokens.weight": normal(r.vocab_size, h)}
    for i in range(r.num_hidden_layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = np.ones(h, np.float32)
        w[p + "post_attention_layernorm.weight"] = np.ones(h, np.float32)
        w[p + "self_attn.q_proj.weight"] = normal(q, h)
        w[p + "self_attn.k_proj.weight"] = normal(kv, h)
        w[p + "self_attn.v_proj.weight"] = normal(kv, h)
        w[p + "self_attn.o_proj.weight"] = normal(h, q)
        w[p + "self_attn.q_norm.weight"] = np.ones(r.head_dim, np.float32)
        w[p + "self_attn.k_norm.weight"] = np.ones(r.head_dim, np.float32)
        w[p + "mlp.gate_proj.weight"] = normal(r.intermediate_size, h)
        w[p + "mlp.up_proj.weight"] = normal(r.intermediate_size, h)
        w[p + "mlp.down_proj.weight"] = normal(h, r.intermediate_size)
    w["model.norm.weight"] = np.ones(h, np.float32)
    return w


def _training_corpus(seed: int) -> list[str]:
    """A fixed synthetic corpus so BPE training gives the same merges every time."""
    rng = np.random.default_rng(seed + 1)
    words = ["prefill", "decode", "block", "cache", "token", "transfer", "nixl", "mooncake",
             "the", "a", "of", "and", "to", "in", "is", "kv", "pool", "admit", "spec", "draft"]
    letters = list("abcdefghijklmnopqrstuvwxyz0123456789 .,;:!?-_/()[]{}'\"\n")
    lines = []
    for _ in range(2000):
        parts = [words[i] for i in rng.integers(0, len(words), 8)]
        parts.append("".join(letters[i] for i in rng.integers(0, len(letters), 24)))
        lines.append(" ".join(parts))
    return lines


def _write_tokenizer(r: TinyModelRecipe, out: Path) -> None:
    """Train a byte-level BPE of exactly ``r.vocab_size`` entries and write HF tokenizer files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|bos|>", "<|eos|>", "<|pad|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=r.vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_corpus(r.seed), trainer=trainer)
    # A vocabulary smaller than the model's would make generated IDs undecodable.
    if tok.get_vocab_size() != r.vocab_size:
        raise ValueError(
            f"tiny_model.vocab_size={r.vocab_size}: the BPE trainer produced "
            f"{tok.get_vocab_size()} tokens; pick a vocab_size between 300 and 4000"
        )
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": specials[0], "eos_token": specials[1], "pad_token": specials[2],
        "model_max_length": r.max_position_embeddings, "chat_template": CHAT_TEMPLATE,
    }, indent=1))


def build_tiny_model(recipe: TinyModelRecipe, out: Path) -> Path:
    """Write config, weights and tokenizer for ``recipe`` into directory ``out``.

    Returns ``out``. Files are written to a temporary sibling and renamed into place, so an
    interrupted build never leaves a half-written model that later runs would reuse.
    """
    from safetensors.numpy import save_file

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp-", dir=out.parent))
    try:
        (tmp / "config.json").write_text(json.dumps(_hf_config(recipe), indent=1, sort_keys=True))
        (tmp / "generation_config.json").write_text(json.dumps({"do_sample": False}))
        save_file(_weights(recipe), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        _write_tokenizer(recipe, tmp)
        (tmp / "pdrig-recipe.json").write_text(recipe.model_dump_json(indent=1))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def tiny_model_dir(recipe: TinyModelRecipe, cache_dir: Path) -> Path:
    """Where the model for ``recipe`` lives under ``cache_dir`` (built or not):
    ``cache_dir/tiny-qwen3-<cache_key>``."""
    return cache_dir / f"tiny-qwen3-{recipe.cache_key()}"


def ensure_tiny_model(recipe: TinyModelRecipe, cache_dir: Path) -> Path:
    """Return the model directory for ``recipe`` under ``cache_dir`` (:func:`tiny_model_dir`),
    building it if missing. A complete build has ``pdrig-recipe.json`` (written last), so its
    presence means the model is usable.
    """
    out = tiny_model_dir(recipe, cache_dir)
    if (out / "pdrig-recipe.json").is_file():
        return out
    return build_tiny_model(recipe, out)
