"""The Hugging Face GPT-2 format, both ways: a GPT of this project as a directory that
``transformers`` loads with no custom code (``GPT2LMHeadModel`` and a fast tokenizer), and such a
directory as a GPT to train on. Only torch, safetensors and tokenizers: ``transformers`` is not
needed to write or read the format.

The two layouts differ in three places: GPT-2's ``Conv1D`` layers store their weight transposed
(in, out) where ``nn.Linear`` stores (out, in); GPT-2 always has biases (a model without them
exports zeros); and GPT-2 always has a learned position table (a sinusoidal one is written as that
table, and read back as sinusoidal when it is exactly that table). Whatever one format cannot hold
exactly is refused with ``NotExpressible``, never approximated.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from raydp_llm.core.errors import InputError
from raydp_llm.core.model_config import GPTConfig
from raydp_llm.core.tokenizer import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, Tokenizer
from raydp_llm.models.base import LanguageModel
from raydp_llm.models.files import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    NotExpressible,
    hf_tokenizer,
    write_json,
)
from raydp_llm.models.gpt import GPT, SinusoidalPositions

LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default, and GPT-2's
# GPT-2's activation names → this GPT's model.activation, and back
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh"}


@dataclass(frozen=True)
class Pair:
    ours: str  # the parameter's name in GPT
    theirs: str  # its name in GPT2LMHeadModel
    conv1d: bool = False  # a weight GPT-2 stores transposed


def pairs(n_layer: int) -> list[Pair]:
    """Every tensor of a GPT with its GPT-2 name, but the position table and the output head."""
    out = [Pair("wte.weight", "transformer.wte.weight")]
    norms = ["ln_f"] + [f"{i}.{norm}" for i in range(n_layer) for norm in ("ln_1", "ln_2")]
    for norm in norms:
        ours = norm if norm == "ln_f" else f"blocks.{norm}"
        theirs = f"transformer.{norm}" if norm == "ln_f" else f"transformer.h.{norm}"
        out += [Pair(f"{ours}.{p}", f"{theirs}.{p}") for p in ("weight", "bias")]
    linears = (("attn.qkv", "attn.c_attn"), ("attn.proj", "attn.c_proj"), ("mlp.fc", "mlp.c_fc"),
               ("mlp.proj", "mlp.c_proj"))
    for i in range(n_layer):
        for ours, theirs in linears:
            out += [Pair(f"blocks.{i}.{ours}.weight", f"transformer.h.{i}.{theirs}.weight", True),
                    Pair(f"blocks.{i}.{ours}.bias", f"transformer.h.{i}.{theirs}.bias")]
    return out


# ---- export --------------------------------------------------------------------------------------

def gpt2_config(cfg: GPTConfig, eod_id: int | None) -> dict:
    """GPT2LMHeadModel's ``config.json`` for a GPT of ``cfg``."""
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.block_size,
        "n_embd": cfg.n_embd,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_inner": 4 * cfg.n_embd,
        "activation_function": HF_ACTIVATIONS[cfg.activation],
        "layer_norm_epsilon": LAYER_NORM_EPS,
        "resid_pdrop": cfg.dropout,
        "embd_pdrop": cfg.dropout,
        "attn_pdrop": cfg.dropout,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "tie_word_embeddings": cfg.tie_weights,
        "bos_token_id": eod_id,
        "eos_token_id": eod_id,
        "dtype": "float32",
    }


def check_exportable(model: LanguageModel) -> None:
    """NotExpressible unless ``model`` is a GPT (GPT-2's format holds nothing else exactly)."""
    if not isinstance(model, GPT):
        raise NotExpressible(f"a {model.kind} model has no Hugging Face GPT-2 equivalent (only "
                             "GPT models export); use it here with python -m raydp_llm.generate")


def gpt2_tensors(model: LanguageModel) -> dict[str, torch.Tensor]:
    """``model``'s weights under GPT-2's names and layouts; NotExpressible unless it is a GPT."""
    check_exportable(model)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    tensors = {}
    for pair in pairs(model.config.n_layer):
        if pair.ours in state:
            tensors[pair.theirs] = state[pair.ours].t() if pair.conv1d else state[pair.ours]
        else:  # a GPT without biases: GPT-2's are zero
            tensors[pair.theirs] = torch.zeros(state[pair.ours[:-4] + "weight"].shape[0])
    sinusoidal = isinstance(model.wpe, SinusoidalPositions)
    tensors["transformer.wpe.weight"] = model.wpe.table.cpu() if sinusoidal else state["wpe.weight"]
    if not model.config.tie_weights:
        tensors["lm_head.weight"] = state["lm_head.weight"]
    return {k: v.contiguous().clone() for k, v in tensors.items()}


def save_gpt2_dir(directory: Path, model: LanguageModel, tokenizer: Tokenizer | None) -> Path:
    """Write ``model`` (and ``tokenizer``, unless None) into ``directory`` in GPT-2's format."""
    tensors = gpt2_tensors(model)
    eod_id = tokenizer.eod_id if tokenizer is not None else None
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, directory / WEIGHTS_FILE, metadata={"format": "pt"})
    write_json(directory / CONFIG_FILE, gpt2_config(model.config, eod_id))
    if tokenizer is not None:
        text, config = hf_tokenizer(tokenizer, model.config.block_size)
        (directory / TOKENIZER_FILE).write_text(text)
        write_json(directory / TOKENIZER_CONFIG_FILE, config)
    return directory


# ---- import --------------------------------------------------------------------------------------

def read_gpt2_config(directory: str | Path) -> dict:
    """A GPT-2 directory's ``config.json``; InputError when there is none or it is not GPT-2."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise InputError(f"model.init_from={directory}: no {CONFIG_FILE}; give a local directory "
                         "saved by transformers' save_pretrained (GPT-2 format)")
    try:
        config = json.loads(path.read_text())
    except ValueError as err:
        raise InputError(f"model.init_from={directory}: {CONFIG_FILE} is not JSON ({err}); give "
                         "the directory save_pretrained wrote") from None
    if config.get("model_type") != "gpt2":
        raise NotExpressible(f"model.init_from={directory}: model_type "
                             f"{config.get('model_type')!r} is not gpt2; only GPT-2-format "
                             "checkpoints load into this GPT")
    return config


def read_gpt2_tensors(directory: str | Path) -> dict[str, torch.Tensor]:
    """The weights of a GPT-2 directory (``model.safetensors``, or the shards its index names),
    under GPT2LMHeadModel's names (a bare GPT2Model's lack the ``transformer.`` prefix)."""
    directory = Path(directory)
    index = directory / f"{WEIGHTS_FILE}.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (directory / WEIGHTS_FILE).is_file():
        shards = [WEIGHTS_FILE]
    else:
        raise InputError(f"model.init_from={directory}: no {WEIGHTS_FILE}; save the model with "
                         "safetensors (save_pretrained's default; pickled .bin files are not read)")
    tensors = {}
    for shard in shards:
        tensors |= load_file(directory / shard)
    return {(k if k.startswith(("transformer.", "lm_head.")) else f"transformer.{k}"): v
            for k, v in tensors.items()}


def gpt2_shape(directory: str | Path, config: dict, tensors: dict[str, torch.Tensor]) -> dict:
    """The GPTConfig fields a GPT-2 checkpoint fixes; NotExpressible for a variant this GPT cannot
    compute exactly."""
    n_embd, n_layer = config["n_embd"], config["n_layer"]
    activation = config.get("activation_function", "gelu_new")  # GPT2Config's default
    differences = [
        (config.get("n_inner") not in (None, 4 * n_embd), f"n_inner={config.get('n_inner')} "
                                                           f"(this GPT's MLP is 4 × n_embd)"),
        (abs(config.get("layer_norm_epsilon", LAYER_NORM_EPS) - LAYER_NORM_EPS) > 1e-12,
         f"layer_norm_epsilon={config.get('layer_norm_epsilon')} (this GPT's is 1e-5)"),
        (activation not in ACTIVATIONS, f"activation_function={activation} (this GPT has "
                                        f"{', '.join(ACTIVATIONS)})"),
        (bool(config.get("scale_attn_by_inverse_layer_idx")), "scale_attn_by_inverse_layer_idx"),
        (not config.get("scale_attn_weights", True), "scale_attn_weights=false"),
        (bool(config.get("add_cross_attention")), "add_cross_attention"),
    ]
    unsupported = [what for differs, what in differences if differs]
    if unsupported:
        raise NotExpressible(f"model.init_from={directory}: {'; '.join(unsupported)}: this GPT "
                             "cannot compute that model exactly, so it is not loaded")
    wpe = tensors["transformer.wpe.weight"]
    biases = [tensors[p.theirs] for p in pairs(n_layer) if p.theirs.endswith(".bias")]
    sinusoidal = torch.equal(wpe, SinusoidalPositions(wpe.shape[0], n_embd).table)
    return {"vocab_size": tensors["transformer.wte.weight"].shape[0],
            "block_size": wpe.shape[0], "n_layer": n_layer, "n_head": config["n_head"],
            "n_embd": n_embd, "bias": any(bool(b.any()) for b in biases),
            "tie_weights": config.get("tie_word_embeddings", True),
            "pos_embedding": "sinusoidal" if sinusoidal else "learned",
            "activation": ACTIVATIONS[activation]}


def load_gpt2_weights(model: GPT, tensors: dict[str, torch.Tensor], shown_as: str) -> None:
    """GPT-2 ``tensors`` into ``model`` (its shape from ``gpt2_shape``; a shorter block_size takes
    the first positions of the table)."""
    want = model.state_dict()
    state = {}
    try:
        for pair in pairs(model.config.n_layer):
            if pair.ours in want:
                tensor = tensors[pair.theirs]
                state[pair.ours] = tensor.t() if pair.conv1d else tensor
        if "wpe.weight" in want:
            state["wpe.weight"] = tensors["transformer.wpe.weight"][: model.config.block_size]
        state["lm_head.weight"] = (state["wte.weight"] if model.config.tie_weights
                                   else tensors["lm_head.weight"])
    except KeyError as err:
        raise InputError(f"model.init_from={shown_as}: {WEIGHTS_FILE} has no tensor {err}; give "
                         "a complete GPT2LMHeadModel checkpoint") from None
    model.load_state_dict(state)
