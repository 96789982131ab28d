"""GRPO's answers (training/objectives/rollout.py, draws.py): counter-based draws whose hash is
SplitMix64's, drawn in batches of any size to the same answers, stopped at any of several end ids,
for the GPT and a transformers Llama."""

from __future__ import annotations

import pytest
import torch

from raydp_llm.core.grpo_config import GrpoSettings
from raydp_llm.core.model_config import GPTConfig, LlamaConfig
from raydp_llm.models.factory import build_model
from raydp_llm.training.objectives.draws import GOLDEN, MIX, answer_key, mix, pick, uniforms
from raydp_llm.training.objectives.rollout import PAD, Draw, answer, answers_to, end_ids

WORD = (1 << 64) - 1


def splitmix64(z: int) -> int:
    """SplitMix64's finalizer in Python's integers (the reference)."""
    z = ((z ^ (z >> 30)) * MIX[0]) & WORD
    z = ((z ^ (z >> 27)) * MIX[1]) & WORD
    return z ^ (z >> 31)


def test_the_draws_hash_is_splitmix64_and_its_numbers_uniform():
    keys = [0, 1, 12345, answer_key(1, 2, 3, 4), -1, -(1 << 63), (1 << 63) - 1]
    got = mix(torch.tensor(keys, dtype=torch.int64)).tolist()
    assert [g & WORD for g in got] == [splitmix64(k & WORD) for k in keys]
    u = uniforms(torch.tensor(keys, dtype=torch.int64), position=5)
    expected = [(splitmix64((k + 6 * GOLDEN) & WORD) >> 11) * 2.0 ** -53 for k in keys]
    assert u.tolist() == expected
    many = uniforms(torch.arange(20000, dtype=torch.int64), position=0)
    assert 0 <= float(many.min()) and float(many.max()) < 1
    assert abs(float(many.mean()) - 0.5) < 0.01
    assert answer_key(1, 2, 3, 4) != answer_key(1, 2, 3, 5)


def test_a_pick_inverts_the_distribution_at_its_number_within_the_nucleus():
    probs = torch.tensor([[0.1, 0.9]]).repeat(400, 1)
    u = uniforms(torch.arange(400, dtype=torch.int64), 0)
    drawn = pick(probs, u, top_p=1.0)
    assert 330 < int(drawn.sum()) < 390  # about 90% of token 1
    assert drawn.tolist() == [int(x >= 0.1) for x in u.tolist()]
    nucleus = pick(torch.tensor([[0.5, 0.3, 0.2]]).repeat(200, 1), u[:200], top_p=0.6)
    assert set(nucleus.tolist()) == {0, 1}  # 0.5 + 0.3 reach 0.6: token 2 is outside


@pytest.fixture(scope="module", params=["gpt", "llama"])
def model(request):
    torch.manual_seed(0)
    if request.param == "gpt":
        config = GPTConfig(vocab_size=24, block_size=40, n_layer=2, n_head=2, n_embd=16)
    else:
        config = LlamaConfig(vocab_size=24, block_size=40, n_layer=2, n_head=2, n_kv_head=1,
                             n_embd=16, intermediate_size=32)
    return build_model(config).eval()


PROMPTS = [torch.tensor(p) for p in ([3, 4, 5], [7], [9, 10, 11, 12, 13, 2], [3, 4, 5],
                                     [20, 21], [5, 6, 7, 8])]


@pytest.mark.parametrize("greedy", [False, True])
def test_the_answers_do_not_depend_on_the_batch_they_are_drawn_in(model, greedy):
    """Six prompts of five lengths, 4 answers each: drawn 1, 8 or 64 sequences at a time (left
    padding in the larger batches), by one worker or split between two, the same answers."""
    draws = [Draw(seed=1, step=5, prompt=10 + i) for i in range(len(PROMPTS))]
    ends = (2, 17)

    def drawn(size, part=slice(None)):
        grpo = GrpoSettings(num_generations=4, max_new_tokens=12, temperature=1.5,
                            generation_batch_size=size)
        return answers_to(model, PROMPTS[part], draws[part], grpo, ends, greedy)

    alone = drawn(1)
    for other in (drawn(8), drawn(64), drawn(64, slice(0, 3)) + drawn(64, slice(3, 6))):
        for a, b in zip(alone, other, strict=True):
            assert torch.equal(a.ids, b.ids) and torch.equal(a.mask, b.mask)
    assert len({tuple(r) for a in alone for r in a.ids.tolist()}) > 4  # answers differ
    assert any(not a.mask.all() for a in alone) or greedy  # some ended at an end id


def test_an_answer_ends_at_any_of_its_end_ids(model):
    grpo = GrpoSettings(num_generations=8, max_new_tokens=16, temperature=2.0)
    free = answer(model, torch.tensor([3, 4]), Draw(1, 0, 0), grpo, ends=())
    assert free.mask.all() and free.ids.shape == (8, 16)
    first, second = int(free.ids[0, 1]), int(free.ids[1, 2])  # tokens the answers do draw
    ended = answer(model, torch.tensor([3, 4]), Draw(1, 0, 0), grpo, ends=(first, second))
    stops = set()
    for row, mask in zip(ended.ids.tolist(), ended.mask.tolist()):
        own = [t for t, m in zip(row, mask) if m]
        at = next((i for i, t in enumerate(own) if t in (first, second)), None)
        if at is not None:
            stops.add(own[at])
            assert len(own) == at + 1  # nothing after the end
        assert all(t == PAD for t, m in zip(row, mask) if not m)
    assert stops == {first, second}


def test_the_end_ids_are_the_templates_the_tokenizers_and_the_models():
    """A transformers model's generation config may list several end ids (Llama 3's): each ends
    an answer, beside the chat template's end of turn and the tokenizer's end of document."""
    from raydp_llm.core.tokenizer import CharTokenizer

    tokenizer = CharTokenizer("abcdefghijklmnop|")
    torch.manual_seed(0)
    llama = build_model(LlamaConfig(vocab_size=24, block_size=16, n_layer=1, n_head=2,
                                    n_kv_head=1, n_embd=8, intermediate_size=16))
    llama.net.generation_config.eos_token_id = [5, 6]
    assert end_ids(tokenizer, "|", llama) == (16, tokenizer.eod_id, 5, 6)
    assert end_ids(tokenizer, "ab", None) == (tokenizer.eod_id,)  # two tokens: not an end


def test_the_answers_log_probabilities_come_from_their_positions_alone(model):
    """``answer_logps`` of two prompts' answers in one batch (the shorter prompt left-padded, the
    shorter answers right-padded; the answer positions' logits alone, a cross-entropy per token)
    equals each prompt's log-softmax of every position's logits sliced to its answers, values and
    gradients."""
    from raydp_llm.training.objectives.grpo_loss import answer_batch, answer_logps

    prompts = [torch.tensor([3, 4, 5, 6]), torch.tensor([8, 9])]
    answers = [torch.tensor([[7, 8, 9], [10, 2, 11]]), torch.tensor([[12, 13], [14, 15]])]
    model.train()
    try:
        expected = []
        for prompt, group in zip(prompts, answers):
            ids = torch.cat([prompt.unsqueeze(0).expand(2, -1), group], dim=1)
            whole = model(ids[:, :-1])[0][:, prompt.numel() - 1:] / 1.3
            expected.append(torch.log_softmax(whole, -1).gather(2, group.unsqueeze(2))[..., 0])
        sum(e.sum() for e in expected).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad()
        masks = [torch.ones_like(a, dtype=torch.bool) for a in answers]
        batch = answer_batch(prompts, answers, masks, [torch.zeros(2), torch.zeros(2)])
        got = answer_logps(model, batch, 1.3)
        (got * batch.mask).sum().backward()
        assert torch.allclose(got[:2], expected[0], atol=1e-5)
        assert torch.allclose(got[2:, :2], expected[1], atol=1e-5)
        assert not batch.mask[2:, 2].any()  # the shorter answers' padding
        for name, p in model.named_parameters():
            if name in grads:
                assert torch.allclose(p.grad, grads[name], atol=1e-5), name
    finally:
        model.zero_grad()
        model.eval()
