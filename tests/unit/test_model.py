import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from helpers.paths import CONF_DIR
from raydp_llm.checkpoint.model_dir import load_model_dir, save_model_dir
from raydp_llm.cli.generate import main as generate_main
from raydp_llm.core.config import GPTConfig, LSTMConfig, model_config
from raydp_llm.core.errors import InputError
from raydp_llm.core.tokenizer import CharTokenizer
from raydp_llm.models.base import LanguageModel
from raydp_llm.models.factory import build_model
from raydp_llm.models.gpt import GPT
from raydp_llm.models.lstm import LSTMLM
from raydp_llm.training.driver.generation import sample_text, top_next_tokens

CFG = GPTConfig(vocab_size=11, block_size=16, n_layer=2, n_head=2, n_embd=32)
LSTM_CFG = LSTMConfig(vocab_size=11, block_size=16, n_layer=2, n_embd=32)
TOKENIZER = CharTokenizer("abcdefghij")  # 10 characters + the end-of-document token: vocab_size 11
PRESETS = {"gpt", "gpt_nano", "gpt_tiny", "gpt_mini", "gpt2_small", "lstm", "llama", "llama_wide",
           "hf", "hf_lora"}
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_shapes_and_loss():
    model = GPT(CFG)
    x = torch.randint(0, 11, (3, 16))
    logits, none = model(x)
    assert logits.shape == (3, 16, 11) and none is None
    nothing, scores = model(x, x)
    assert nothing is None and scores.nats.shape == scores.hits.shape == (3, 16)
    assert abs(scores.mean.item() - torch.log(torch.tensor(11.0)).item()) < 0.5  # near uniform


def test_weights_are_tied():
    model = GPT(CFG)
    assert model.lm_head.weight.data_ptr() == model.wte.weight.data_ptr()


def test_causality_future_tokens_never_change_the_past():
    torch.manual_seed(0)
    model = GPT(CFG).eval()
    x = torch.randint(0, 11, (1, 16))
    t = 9
    y = x.clone()
    y[0, t:] = (y[0, t:] + 1) % 11
    with torch.no_grad():
        a, _ = model(x)
        b, _ = model(y)
    assert torch.allclose(a[0, :t], b[0, :t], atol=1e-6)
    assert not torch.allclose(a[0, t], b[0, t])


def test_generation_is_deterministic_with_a_seed(tmp_path):
    torch.manual_seed(0)
    tok = CharTokenizer("abcdefghij ")  # 11 characters + the end-of-document token
    save_model_dir(tmp_path, GPT(replace(CFG, vocab_size=tok.vocab_size)), tok)
    model, tok2 = load_model_dir(tmp_path)
    a = sample_text(model, tok2, "abc", 40, temperature=1.0, top_k=5, seed=7)
    b = sample_text(model, tok2, "abc", 40, temperature=1.0, top_k=5, seed=7)
    c = sample_text(model, tok2, "abc", 40, temperature=1.0, top_k=5, seed=8)
    assert (
        a == b and a != c and a.startswith("abc") and len(a) >= 43
    )  # 40 tokens of one character or more


@pytest.mark.parametrize("cfg", [CFG, replace(CFG, pos_embedding="sinusoidal"), LSTM_CFG],
                         ids=["gpt", "gpt-sinusoidal", "lstm"])
def test_generation_with_carried_state_equals_recomputing_the_window(cfg):
    """The KV cache and the LSTM's carried (h, c) give the logits and tokens of the window
    recomputed for every token: inside the block, where the window starts at token 0, and past it,
    where the window slides (a batch of 2, 40 tokens through a block of 16)."""
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    idx = torch.randint(0, cfg.vocab_size, (2, 3))
    state = None
    for _ in range(40):
        logits, state = model.next_logits(idx, state)
        recomputed, _ = LanguageModel.next_logits(model, idx)
        torch.testing.assert_close(logits, recomputed, atol=1e-5, rtol=1e-5)
        idx = torch.cat([idx, logits.argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(model.generate(idx[:, :3], 40, temperature=0), idx)


def test_model_dir_round_trip_keeps_outputs(tmp_path):
    torch.manual_seed(1)
    model = GPT(CFG).eval()
    save_model_dir(tmp_path, model, TOKENIZER)
    loaded, _ = load_model_dir(tmp_path)
    x = torch.randint(0, 11, (2, 16))
    with torch.no_grad():
        assert torch.equal(model(x)[0], loaded(x)[0])


def train_losses(model, steps: int = 30) -> list[float]:
    """Losses while fitting a repeated 0..9 pattern."""
    torch.manual_seed(0)
    x = (torch.arange(17)[None, :] + torch.arange(8)[:, None]) % 10  # (8, 17)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-2)
    losses = []
    for _ in range(steps):
        _, scores = model(x[:, :-1], x[:, 1:])
        loss = scores.mean
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_sinusoidal_positions_are_a_buffer_and_train():
    torch.manual_seed(0)
    model = build_model(replace(CFG, pos_embedding="sinusoidal"))
    assert not any(name.startswith("wpe") for name, _ in model.named_parameters())
    assert not any(
        key.startswith("wpe") for key in model.state_dict()
    )  # non-persistent: recomputed on load
    assert model.num_params() == GPT(CFG).num_params() - CFG.block_size * CFG.n_embd
    losses = train_losses(model)
    assert losses[-1] < 0.5 * losses[0]


def test_lstm_shapes_training_and_generation():
    torch.manual_seed(0)
    model = LSTMLM(LSTM_CFG)
    assert model.lm_head.weight is model.wte.weight
    x = torch.randint(0, 11, (3, 16))
    logits, none = model(x)
    _, scores = model(x, x)
    assert logits.shape == (3, 16, 11) and none is None
    assert abs(scores.mean.item() - np.log(11)) < 0.5
    losses = train_losses(model)
    assert losses[-1] < 0.5 * losses[0]
    out = model.eval().generate(
        x[:1, :5], 20, temperature=1.0, top_k=3, generator=torch.Generator().manual_seed(1)
    )
    assert out.shape == (1, 25) and torch.equal(out[:, :5], x[:1, :5])


def test_build_model_kinds_and_bad_settings():
    assert isinstance(build_model(LSTM_CFG), LSTMLM)
    untied = build_model(replace(CFG, tie_weights=False))
    assert untied.lm_head.weight is not untied.wte.weight
    assert untied.num_params() == GPT(CFG).num_params() + 11 * 32
    with pytest.raises(ValueError, match=r"model.kind=rnn is not one of gpt \| lstm"):
        model_config("rnn", {"vocab_size": 11})  # a model directory's config.json
    with pytest.raises(InputError, match="model.kind=lstm has no setting n_head, bias"):
        model_config("lstm", {"vocab_size": 11, "n_head": 2, "bias": True})
    with pytest.raises(InputError, match="model.pos_embedding=rope is not one of learned | "
                                         "sinusoidal"):
        GPTConfig(vocab_size=11, pos_embedding="rope")
    LSTMConfig(n_layer=1)  # before the data: no vocab_size yet
    with pytest.raises(InputError, match="model.n_embd=128 is not divisible by model.n_head=3"):
        GPTConfig(n_head=3)


def embeddings_spec(kind: str, path):
    config = CFG if kind == "gpt" else LSTM_CFG
    return replace(config, init_embeddings=str(path), freeze_embeddings=True)


@pytest.mark.parametrize("kind", ["gpt", "lstm"])
@pytest.mark.parametrize("fmt", ["csv", "csv_header", "npy_ids", "npy_table"])
def test_init_embeddings_set_the_rows_and_freeze_keeps_them(tmp_path, kind, fmt):
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(11, 32)).astype(np.float32)
    ids = np.array([0, 3, 7])
    rows = np.column_stack([ids, vectors[ids]])
    if fmt.startswith("csv"):
        path = tmp_path / "vectors.csv"
        np.savetxt(
            path,
            rows,
            delimiter=",",
            fmt=["%d"] + ["%.8g"] * 32,
            header="id," + ",".join(f"v{i}" for i in range(32)) if fmt == "csv_header" else "",
            comments="",
        )
    else:
        path = tmp_path / "vectors.npy"
        np.save(path, rows if fmt == "npy_ids" else vectors)
        ids = ids if fmt == "npy_ids" else np.arange(11)
    torch.manual_seed(0)
    model = build_model(embeddings_spec(kind, path))
    wte = model.wte.weight
    assert torch.allclose(wte[ids], torch.from_numpy(vectors[ids]))
    if fmt != "npy_table":  # ids not in the file keep their (seeded) random init
        torch.manual_seed(0)
        random_row = build_model(
            replace(embeddings_spec(kind, path), init_embeddings=None)
        ).wte.weight
        assert torch.equal(wte[1], random_row[1])
    assert not wte.requires_grad
    before = wte.detach().clone()
    train_losses(model, steps=1)
    assert torch.equal(wte, before)


BAD_EMBEDDINGS = [
    ("missing.csv", None, "no such file; give a CSV or .npy file of token vectors"),
    ("dim.csv", "1," + ",".join(["0.5"] * 31), "rows hold 31 vector values but model.n_embd=32"),
    ("range.csv", "11," + ",".join(["0.5"] * 32), "ids [11] lie outside [0, vocab_size=11)"),
    ("negative.csv", "-1," + ",".join(["0.5"] * 32), "ids [-1] lie outside [0, vocab_size=11)"),
    ("float_id.csv", "1.5," + ",".join(["0.5"] * 32), "ids are not integers (e.g. 1.5)"),
    ("text.csv", "id,x\n1,a", "not a table of numbers"),
    ("empty.csv", "id,v1", "no rows"),
    ("shape.npy", np.zeros((11, 31)), "an array of shape (11, 31) is neither (vocab_size, n_embd) "
                                      "= (11, 32)"),
    ("float_id.npy", np.full((2, 33), 0.5), "ids are not integers"),
]


@pytest.mark.parametrize("name,content,message", BAD_EMBEDDINGS, ids=[b[0] for b in BAD_EMBEDDINGS])
def test_bad_embeddings_files_are_one_clear_line(tmp_path, name, content, message):
    path = tmp_path / name
    if isinstance(content, str):
        path.write_text(content + "\n")
    elif content is not None:
        np.save(path, content)
    with pytest.raises(InputError) as err:
        build_model(embeddings_spec("gpt", path))
    text = str(err.value)
    assert text.startswith(f"model.init_embeddings={path}: "
                           "") and message in text and "\n" not in text, text


@pytest.mark.parametrize("spec", [
    replace(CFG, pos_embedding="sinusoidal", tie_weights=False),
    replace(LSTM_CFG, tie_weights=False),
    LSTM_CFG,
], ids=["gpt-sinusoidal-untied", "lstm-untied", "lstm-tied"])
def test_model_dir_round_trip_for_every_kind(tmp_path, spec):
    torch.manual_seed(2)
    model = build_model(spec).eval()
    save_model_dir(tmp_path, model, TOKENIZER)
    assert json.loads((tmp_path / "config.json").read_text())["model"] == spec.kind
    loaded, _ = load_model_dir(tmp_path)
    assert type(loaded) is type(model) and loaded.config == model.config
    x = torch.randint(0, 11, (2, 16))
    with torch.no_grad():
        assert torch.equal(model(x)[0], loaded(x)[0])


def test_top_next_tokens_are_the_most_likely_in_order():
    torch.manual_seed(3)
    model = GPT(CFG).eval()
    top = top_next_tokens(model, TOKENIZER, "abc", 5)
    probs = [p for _, p in top]
    assert len(top) == 5 and all(isinstance(t, str) for t, _ in top)
    assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-6
    assert len(top_next_tokens(model, TOKENIZER, "abc", 50)) == 11  # at most the vocabulary
    logits, _ = model(torch.tensor([[0, 1, 2]]))
    assert top[0][0] == TOKENIZER.decode([logits[0, -1].argmax().item()])


def test_generate_cli_shows_the_next_token_probabilities(tmp_path, capsys):
    torch.manual_seed(4)
    save_model_dir(tmp_path, LSTMLM(LSTM_CFG), TOKENIZER)
    assert (
        generate_main([f"model_dir={tmp_path}", "prompt=abc", "max_new_tokens=5", "show_top=3"])
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[-4] == "next-token top 3 after the prompt:"
    model, _ = load_model_dir(tmp_path)
    assert lines[-3:] == [f"  {t!r}  "
                          f"{p:.4f}" for t, p in top_next_tokens(model, TOKENIZER, "abc", 3)]


@pytest.mark.parametrize("preset,vocab_size,params", [
    ("gpt", 65, 804_096), ("gpt_nano", 65, 804_096), ("gpt_tiny", 65, 106_880),
    ("gpt_mini", 65, 2_693_760),
    ("gpt2_small", 50257, 124_439_808),  # GPT-2 small's published count
    ("lstm", 65, 1_069_312),
    ("llama", 65, 800_000),  # the baby GPT's count within 0.5% (model=hf: test_pretrained.py)
    ("llama_wide", 65, 800_800),  # shakespeare_llama's: the same count in two wider layers
])
def test_every_model_preset_composes_and_builds(preset, vocab_size, params):
    assert {p.stem for p in (CONF_DIR / "model").glob("*.yaml")} == PRESETS
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"model={preset}"])
    with torch.device("meta"):  # shapes only: no memory, no init time
        model = build_model(replace(OmegaConf.to_object(cfg.model), vocab_size=vocab_size))
    assert model.kind == cfg.model.kind and model.num_params() == params


def _truncate(path):
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size // 2)


def _unseal_and(change):
    def damage(d):
        (
            d / "complete.json"
        ).unlink()  # as a model directory made by hand, or by an older version, has none
        change(d)
    return damage


def _other_width(d):
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(config | {"n_embd": 64}))


@pytest.mark.parametrize("damage,message", [
    (lambda d: _truncate(d / "model.safetensors"), r"damaged, model.safetensors has \d+ bytes, \d+ "
                                                   r"were written"),
    (lambda d: (d / "tokenizer.json").write_text('{"kind": "char", "chars": "xyz"}'),
     r"damaged, tokenizer.json has \d+ bytes, \d+ were written"),
    (_unseal_and(lambda d: _truncate(d / "model.safetensors")), r"model.safetensors is damaged \("),
    (_unseal_and(_other_width), r"model.safetensors does not fit its config.json \(wte.weight is "
                                r"\(11, 32\) in the file, \(11, 64\) in the model\)"),
    (_unseal_and(lambda d: (d / "tokenizer.json").write_text("{not json")), r"tokenizer.json is "
                                                                            r"unreadable \("),
    (_unseal_and(lambda d: (d / "tokenizer.json").write_text('{"kind": "char", "chars": "xyz"}')),
     r"tokenizer.json has 4 ids but config.json says vocab_size=11; give the tokenizer of the run"),
    (_unseal_and(lambda d: (d / "config.json").write_text("[]")), r"config.json is not a model "
                                                                  r"config"),
])
def test_a_damaged_or_mismatched_model_dir_is_one_line(tmp_path, damage, message):
    save_model_dir(tmp_path, GPT(CFG), TOKENIZER)
    damage(tmp_path)
    with pytest.raises(InputError, match=rf"^{tmp_path}: {message}"):
        load_model_dir(tmp_path)


def test_generate_refuses_a_damaged_model_with_one_line(tmp_path, capsys):
    save_model_dir(tmp_path, GPT(CFG), TOKENIZER)
    _truncate(tmp_path / "model.safetensors")
    assert generate_main([f"model_dir={tmp_path}", "prompt=abc"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {tmp_path}: damaged, model.safetensors "
                                                   "has")


def test_init_embeddings_of_the_wrong_width_are_refused_before_any_engine(tmp_path):
    from helpers.configs import make_config
    from raydp_llm.cli.inputs import check_inputs

    vectors = tmp_path / "vectors.csv"
    vectors.write_text("0,0.1,0.2\n1,0.3,0.4\n")
    with pytest.raises(InputError, match=rf"model.init_embeddings={vectors}: rows hold 2 vector "
                                         r"values but model.n_embd=128"):
        check_inputs(make_config(f"model.init_embeddings={vectors}"))
    np.save(tmp_path / "table.npy", np.zeros((7, 16)))
    with pytest.raises(InputError, match=r"an array of shape \(7, 16\) is neither \(vocab_size, "
                                         r"n_embd\) = \(vocab_size, 128\)"):
        check_inputs(make_config(f"model.init_embeddings={tmp_path / 'table.npy'}"))
