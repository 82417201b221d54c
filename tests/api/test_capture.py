"""Attention-score capture through transformers' AttentionInterface, on tiny random models."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    AlbertConfig,
    AlbertModel,
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    DistilBertConfig,
    DistilBertForSequenceClassification,
)

from harness.api.capture import (
    ATTN_IMPLEMENTATION,
    capture_attention_scores,
    padding_key_mask,
    token_pair_mask,
)
from tests.reference_formulas import manual_attention_scores

VOCAB, HIDDEN, HEADS = 60, 32, 4
HEAD_DIM = HIDDEN // HEADS
LENGTHS = (7, 4, 5)  # real tokens per row; the batch is padded to 7


def bert_config(layers: int = 3, **changes) -> BertConfig:
    return BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=layers,
                      num_attention_heads=HEADS, intermediate_size=64,
                      max_position_embeddings=32, **changes)


def padded_batch(lengths: tuple[int, ...] = LENGTHS, seed: int = 1) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    input_ids = torch.randint(1, VOCAB, (len(lengths), width), generator=generator)
    attention_mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    return {"input_ids": input_ids * attention_mask, "attention_mask": attention_mask}


def manual_scores(self_attention: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    return manual_attention_scores(self_attention, hidden, HEADS)


def test_scores_equal_manual_qk_on_real_tokens_and_padded_keys_hold_the_mask_value():
    torch.manual_seed(0)
    model = BertModel(bert_config(layers=3)).eval()
    batch = padded_batch()
    with torch.no_grad(), capture_attention_scores(model) as capture:
        outputs = model(**batch, output_hidden_states=True)
    assert len(capture.scores) == 3
    assert capture.layers == (1, 2, 3)
    for layer, captured in enumerate(capture.scores):
        assert captured.shape == (3, HEADS, 7, 7)
        expected = manual_scores(model.encoder.layer[layer].attention.self,
                                 outputs.hidden_states[layer])
        for row, length in enumerate(LENGTHS):
            torch.testing.assert_close(captured[row, :, :length, :length],
                                       expected[row, :, :length, :length],
                                       rtol=0, atol=1e-6)
            padded_keys = captured[row, :, :, length:]
            if length < 7:
                assert (padded_keys < -1e30).all(), "padded keys must carry the mask value"
    assert capture.layer(2) is capture.scores[1]


def test_unpadded_batch_has_no_mask_in_the_scores():
    torch.manual_seed(0)
    model = BertModel(bert_config(layers=2)).eval()
    batch = padded_batch(lengths=(6, 6))
    with torch.no_grad(), capture_attention_scores(model) as capture:
        outputs = model(**batch, output_hidden_states=True)
    expected = manual_scores(model.encoder.layer[1].attention.self, outputs.hidden_states[1])
    torch.testing.assert_close(capture.scores[1], expected, rtol=0, atol=1e-6)


def _tiny_distilbert() -> torch.nn.Module:
    config = DistilBertConfig(vocab_size=VOCAB, dim=HIDDEN, n_layers=2, n_heads=HEADS,
                              hidden_dim=64, max_position_embeddings=32, num_labels=3)
    return DistilBertForSequenceClassification(config)


def _tiny_albert() -> torch.nn.Module:
    # ALBERT shares one attention module between all layers: capture must go by call order.
    config = AlbertConfig(vocab_size=VOCAB, embedding_size=16, hidden_size=HIDDEN,
                          num_hidden_layers=3, num_attention_heads=HEADS,
                          intermediate_size=64, max_position_embeddings=32)
    return AlbertModel(config)


MODEL_BUILDERS = {
    "bert-classifier": lambda: BertForSequenceClassification(bert_config(layers=2,
                                                                         num_labels=3)),
    "distilbert-classifier": _tiny_distilbert,
    "albert-shared-layers": _tiny_albert,
}


def _comparable_outputs(output) -> list[torch.Tensor]:
    first = output.logits if hasattr(output, "logits") else output.last_hidden_state
    return [first, *output.hidden_states, *output.attentions]


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train-with-dropout"])
@pytest.mark.parametrize("name", sorted(MODEL_BUILDERS))
def test_outputs_are_identical_to_eager_attention(name: str, training: bool):
    torch.manual_seed(0)
    model = MODEL_BUILDERS[name]().train(training)
    batch = padded_batch()
    model.set_attn_implementation("eager")
    torch.manual_seed(123)
    with torch.no_grad():
        eager = model(**batch, output_hidden_states=True, output_attentions=True)
    with torch.no_grad(), capture_attention_scores(model) as capture:
        torch.manual_seed(123)
        captured = model(**batch, output_hidden_states=True, output_attentions=True)
    assert len(capture.scores) == model.config.num_hidden_layers
    for ours, reference in zip(_comparable_outputs(captured), _comparable_outputs(eager),
                               strict=True):
        torch.testing.assert_close(ours, reference, rtol=0, atol=1e-6)
    assert model.config._attn_implementation == "eager"


def test_padding_is_masked_under_the_capture_implementation():
    """A padded row must give the same result as the same row without padding: catches a
    custom implementation silently running without any padding mask."""
    torch.manual_seed(0)
    model = BertModel(bert_config(layers=2)).eval()
    batch = padded_batch()
    with torch.no_grad(), capture_attention_scores(model) as capture:
        padded = model(**batch).last_hidden_state
        padded_scores = capture.scores[1]
        alone = model(input_ids=batch["input_ids"][1:2, :4],
                      attention_mask=batch["attention_mask"][1:2, :4]).last_hidden_state
        alone_scores = capture.scores[1]
    torch.testing.assert_close(padded[1, :4], alone[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(padded_scores[1, :, :4, :4], alone_scores[0], rtol=0, atol=1e-5)


def test_student_gradients_flow_through_captured_scores_against_an_inference_mode_teacher():
    torch.manual_seed(0)
    teacher = BertModel(bert_config(layers=2)).eval()
    student = BertForSequenceClassification(bert_config(layers=2)).train()
    batch = padded_batch()
    pairs = token_pair_mask(batch["attention_mask"])
    with capture_attention_scores(teacher) as teacher_capture, \
            capture_attention_scores(student) as student_capture:
        with torch.inference_mode():
            teacher(**batch)
        student(**batch)
        teacher_last = teacher_capture.scores[-1]
        student_last = student_capture.scores[-1]
        assert teacher_last.is_inference() and not teacher_last.requires_grad
        difference = torch.where(pairs, student_last - teacher_last, 0.0)
        difference.pow(2).mean().backward()
    last_layer = student.bert.encoder.layer[1].attention.self
    first_layer = student.bert.encoder.layer[0].attention.self
    assert last_layer.query.weight.grad.abs().sum() > 0
    assert last_layer.key.weight.grad.abs().sum() > 0
    assert first_layer.value.weight.grad.abs().sum() > 0  # feeds layer 2's input
    # The loss reads the last layer's scores only, not its attention output.
    assert last_layer.value.weight.grad is None
    assert student.classifier.weight.grad is None


def test_capture_is_undone_on_exit_and_scores_are_replaced_per_forward():
    torch.manual_seed(0)
    model = BertModel(bert_config(layers=2)).eval()
    assert model.config._attn_implementation == "sdpa"
    with torch.no_grad(), capture_attention_scores(model) as capture:
        model(**padded_batch(lengths=(5, 3)))
        first = capture.scores
        model(**padded_batch(lengths=(7, 2)))
        assert capture.scores is not first
        assert [tensor.shape[-1] for tensor in first] == [5, 5]
        assert [tensor.shape[-1] for tensor in capture.scores] == [7, 7]
        with pytest.raises(RuntimeError, match="already being captured"), \
                capture_attention_scores(model):
            pass
    assert model.config._attn_implementation == "sdpa"
    assert not any(hasattr(module, "_harness_score_capture") for module in model.modules())
    with torch.no_grad():
        model(**padded_batch(lengths=(3, 3)))
    assert [tensor.shape[-1] for tensor in capture.scores] == [7, 7]


def test_model_loaded_with_the_capture_implementation_keeps_it():
    from harness.api.capture import register_score_attention

    register_score_attention()
    torch.manual_seed(0)
    model = BertModel(bert_config(layers=2, attn_implementation=ATTN_IMPLEMENTATION)).eval()
    assert model.config._attn_implementation == ATTN_IMPLEMENTATION
    with torch.no_grad(), capture_attention_scores(model) as capture:
        model(**padded_batch())
    assert len(capture.scores) == 2
    assert model.config._attn_implementation == ATTN_IMPLEMENTATION


def test_a_subset_of_layers_is_captured_by_one_based_number():
    torch.manual_seed(0)
    model = BertModel(bert_config(layers=3)).eval()
    batch = padded_batch()
    with torch.no_grad():
        with capture_attention_scores(model) as everything:
            model(**batch)
        with capture_attention_scores(model, layers=[3, 2]) as some:
            model(**batch)
    assert some.layers == (2, 3)
    assert len(some.scores) == 2
    torch.testing.assert_close(some.layer(2), everything.scores[1], rtol=0, atol=0)
    torch.testing.assert_close(some.layer(3), everything.scores[2], rtol=0, atol=0)
    with pytest.raises(KeyError, match="layer 1 is not captured"):
        some.layer(1)
    with pytest.raises(ValueError, match=r"out of range.*1\.\.3"), \
            capture_attention_scores(model, layers=[0, 4]):
        pass


def test_padding_masks_mark_real_tokens():
    attention_mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    keys = padding_key_mask(attention_mask)
    assert keys.dtype == torch.bool and keys.shape == (2, 1, 1, 3)
    assert keys[1, 0, 0].tolist() == [True, True, False]
    pairs = token_pair_mask(attention_mask)
    assert pairs.shape == (2, 1, 3, 3)
    assert pairs[0].all()
    assert pairs[1, 0].tolist() == [[True, True, False], [True, True, False],
                                    [False, False, False]]
    with pytest.raises(ValueError, match="batch, length"):
        padding_key_mask(attention_mask[:, None, None, :])


def test_attention_loss_on_padded_captured_scores_equals_the_unpadded_rows():
    """End to end: the huge mask values in captured scores never reach the loss."""
    from harness.api.losses import attention_score_loss

    torch.manual_seed(0)
    teacher = BertModel(bert_config(layers=2)).eval()
    student = BertModel(bert_config(layers=1)).eval()
    batch = padded_batch()
    squared_errors, pairs = torch.zeros(()), 0
    with capture_attention_scores(teacher) as teacher_capture, \
            capture_attention_scores(student) as student_capture:
        with torch.inference_mode():
            teacher(**batch)
        student(**batch)
        loss = attention_score_loss(student_capture.scores[0], teacher_capture.layer(2),
                                    batch["attention_mask"])
        for row, length in enumerate(LENGTHS):
            alone = {key: value[row:row + 1, :length] for key, value in batch.items()}
            with torch.inference_mode():
                teacher(**alone)
            student(**alone)
            difference = student_capture.scores[0] - teacher_capture.layer(2)
            squared_errors = squared_errors + difference.pow(2).sum()
            pairs += HEADS * length * length
    torch.testing.assert_close(loss, squared_errors / pairs, rtol=1e-5, atol=1e-6)
    (gradient,) = torch.autograd.grad(loss, student.encoder.layer[0].attention.self.query.weight)
    assert torch.isfinite(gradient).all() and gradient.abs().sum() > 0
