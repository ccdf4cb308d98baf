"""The model zoo: parameter counts pinned to the published figures, learnable-layer counts, forward shapes.

The big models are built on the ``meta`` device (shapes only: no memory, no compute); only the small ones
(LeNet-5, ResNet-20, the tiny transformers) run a real forward. Budget: ~6 s.
"""

import pytest
import torch
from torch import nn

from dpcomm.errors import UserError
from dpcomm.models import (
    count_params,
    describe_input,
    example_input,
    get_model,
    input_shape,
    input_vocab,
    learnable_layers,
    model_names,
    num_classes,
    per_token_targets,
)
from dpcomm.models.googlenet import GoogLeNet
from dpcomm.models.inception import InceptionV3

# name: (published parameter count, learnable layers). Sources: torchvision's model table (alexnet, vgg19,
# resnet50, inception_v3 with its aux head), BML (LeNet-5 3.27 M: 832 + 51,264 + 3,212,288 + 10,250),
# He et al. Table 6 (ResNet-20 0.27 M), VGG-19 with a 4096x21841 last layer (~229 M); Hugging Face's
# GPT2Model (124,439,808: nanoGPT's "124.44M" with positions), BertModel with pooler for bert-base-uncased
# (109,482,240) and google/bert_uncased_L-2_H-128_A-2 (BERT-Tiny, 4,385,920), torchvision's vit_b_16
# (86,567,656), TinyLlama-1.1B's LlamaForCausalLM (1,100,048,384). The tiny transformers are ours.
PUBLISHED = {
    "lenet5": (3_274_634, 4),
    "alexnet": (61_100_840, 8),
    "vgg19": (143_667_240, 19),
    "vgg19-22k": (229_052_817, 19),
    "googlenet": (13_004_888, 57 * 2 + 1 + 2 * 4),
    "inception-v3": (27_161_264, 94 * 2 + 1 + 5),
    "resnet50": (25_557_032, 53 * 2 + 1),
    "resnet20": (269_722, 19 * 2 + 1),
    "gpt2": (
        124_439_808,
        2 + 12 * 6 + 1,
    ),  # wte (owns the tied lm_head), wpe; ln, qkv, proj, ln, fc, proj; ln_f
    "bert-base": (
        109_482_240,
        4 + 12 * 8 + 1,
    ),  # 3 embeddings + LayerNorm; q, k, v, o, ln, fc, fc, ln; pooler
    "vit-b16": (
        86_567_656,
        2 + 12 * 6 + 2,
    ),  # class token + positions, patch conv; as GPT-2's blocks; ln, head
    "tinyllama-1.1b": (
        1_100_048_384,
        1 + 22 * 9 + 2,
    ),  # embedding; 2 norms, wq, wk, wv, wo, w1, w3, w2; norm, out
    "gpt2-tiny": (834_304, 2 + 4 * 6 + 1),
    "llama-tiny": (803_968, 1 + 4 * 9 + 2),
    "bert-tiny": (4_385_920, 4 + 2 * 8 + 1),
    "vit-cifar": (809_354, 2 + 4 * 6 + 2),
}
DECODERS = ("gpt2", "tinyllama-1.1b", "gpt2-tiny", "llama-tiny")  # (B, T) tokens in, (B, T, vocab) logits out
TOKEN_MODELS = (*DECODERS, "bert-base", "bert-tiny")


def test_zoo_lists_exactly_the_pinned_models():
    assert model_names() == list(PUBLISHED)


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_parameter_and_layer_counts(name):
    params, layers = PUBLISHED[name]
    assert count_params(name) == params
    with torch.device("meta"):
        model = get_model(name)
    owned = learnable_layers(model)
    assert len(owned) == layers
    assert sum(p.numel() for _, m in owned for p in m.parameters(recurse=False)) == params


def test_headline_figures_of_the_papers():
    assert round(count_params("lenet5") / 1e6, 2) == 3.27  # BML section 5
    assert round(count_params("vgg19") / 1e6, 2) == 143.67
    assert round(count_params("resnet50") / 1e6, 2) == 25.56
    assert round(count_params("vgg19-22k") / 1e6) == 229
    assert round(count_params("alexnet") / 1e6) == 61
    assert round(count_params("gpt2") / 1e6) == 124 and round(count_params("tinyllama-1.1b") / 1e9, 1) == 1.1
    assert round(count_params("bert-base") / 1e6) == 109 and round(count_params("vit-b16") / 1e6, 1) == 86.6


def test_without_auxiliary_heads_matches_torchvision_inference_counts():
    with torch.device("meta"):
        g, i = GoogLeNet(aux_logits=False), InceptionV3(aux_logits=False)
    assert sum(p.numel() for p in g.parameters()) == 6_624_904
    assert sum(p.numel() for p in i.parameters()) == 23_834_568


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_output_shapes_on_meta(name):
    with torch.device("meta"):
        model = get_model(name)
        x = example_input(name, 2, device="meta")
        out = model(x)
        model.eval()
        logits = model(x)
    heads = out if isinstance(out, tuple) else (out,)
    assert len(heads) == {"googlenet": 3, "inception-v3": 2}.get(name, 1)
    per_sample = (*input_shape(name), num_classes(name)) if name in DECODERS else (num_classes(name),)
    assert all(h.shape == (2, *per_sample) for h in (*heads, logits))


def test_token_models_take_int64_token_ids():
    assert {n for n in model_names() if input_vocab(n) is not None} == set(TOKEN_MODELS)
    assert {n for n in model_names() if per_token_targets(n)} == set(DECODERS)
    for name in TOKEN_MODELS:
        x = example_input(name, 3, generator=torch.Generator().manual_seed(0))
        assert x.dtype == torch.int64 and x.shape == (3, *input_shape(name)) and len(input_shape(name)) == 1
        assert 0 <= int(x.min()) and int(x.max()) < input_vocab(name)
    for name in DECODERS:  # a decoder's classes are its vocabulary
        assert num_classes(name) == input_vocab(name)
    assert (
        input_vocab("gpt2") == 50257
        and input_vocab("tinyllama-1.1b") == 32000
        and input_vocab("bert-base") == 30522
    )
    assert describe_input("gpt2") == "T=1024 tokens" and describe_input("vit-b16") == "3x224x224"
    assert example_input("vit-cifar", 2).dtype == torch.float32


def test_gpt2_ties_its_output_projection_to_the_token_embedding():
    with torch.device("meta"):
        model = get_model("gpt2")
    assert model.lm_head.weight is model.wte.weight
    names = [n for n, _ in learnable_layers(model)]
    assert "wte" in names and "lm_head" not in names  # the first owner holds the shared tensor
    untied = 50257 * 768  # counted once: a second copy would be 163,037,184 parameters
    assert sum(p.numel() for p in model.parameters()) + untied == 163_037_184


def test_bert_base_is_bertmodel_with_pooler_and_takes_a_head_for_other_class_counts():
    from dpcomm.models.bert import BERT_BASE, Bert

    with torch.device("meta"):
        head = get_model("bert-base", 2)  # BertForSequenceClassification, 2 labels
        plain = Bert(BERT_BASE)
    assert plain.classifier is None and head.classifier is not None
    assert sum(p.numel() for p in plain.parameters()) == 109_482_240 == count_params("bert-base")
    assert count_params("bert-base", 2) == 109_482_240 + 768 * 2 + 2 == 109_483_778
    out = head(example_input("bert-base", 2, device="meta"))
    assert out.shape == (2, 2)


def test_tinyllama_uses_grouped_kv_heads_and_an_untied_output():
    with torch.device("meta"):
        model = get_model("tinyllama-1.1b")
    attn = model.layers[0].attention
    assert attn.wq.weight.shape == (2048, 2048) and attn.wk.weight.shape == (4 * 64, 2048)  # 4 KV heads of 64
    assert model.layers[0].feed_forward.w1.weight.shape == (5632, 2048)
    assert model.output.weight is not model.tok_embeddings.weight
    assert isinstance(model.norm, nn.RMSNorm)


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two threads on this shared 2-core machine wait on each other
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name, shape", [("lenet5", (1, 28, 28)), ("resnet20", (3, 32, 32))])
def test_small_models_really_run(name, shape, one_thread):
    torch.manual_seed(0)
    assert input_shape(name) == shape
    x = example_input(name, 4)
    assert x.shape == (4, *shape)
    model = get_model(name)
    y = model(x)
    assert y.shape == (4, 10) and torch.isfinite(y).all()
    y.sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    assert get_model(name, num_classes=3)(x).shape == (4, 3)


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny", "bert-tiny", "vit-cifar"])
def test_small_transformers_run_and_every_parameter_gets_a_gradient(name, one_thread):
    from dpcomm.models.loss import classification_loss

    torch.manual_seed(0)
    model, x = get_model(name), example_input(name, 2)
    out = model(x)
    per_sample = (*input_shape(name), num_classes(name)) if name in DECODERS else (num_classes(name),)
    assert out.shape == (2, *per_sample) and torch.isfinite(out).all()
    y = torch.randint(0, num_classes(name), out.shape[:-1])
    classification_loss(out, y).backward()
    assert all(p.grad is not None for p in model.parameters())
    assert [n for n, _ in learnable_layers(model, x)][0] in (
        "wte",
        "tok_embeddings",
        "embeddings.word_embeddings",
        "embed",
    )


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny"])
def test_tiny_decoders_learn_a_batch_in_a_few_steps(name, one_thread):
    from dpcomm.models.loss import classification_loss

    torch.manual_seed(0)
    model = get_model(name)
    text = torch.tensor(list(b"def f(x):\n    return x + 1\n" * 12), dtype=torch.int64)
    x, y = text[:64].view(1, 64), text[1:65].view(1, 64)  # next-byte targets
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        loss = classification_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(5.55, abs=0.3)  # ln 256: uniform over bytes at initialisation
    assert losses[-1] < losses[0] - 1.0


def test_forward_order_puts_aux_heads_where_they_run():
    with torch.device("meta"):
        model = get_model("googlenet")
        names = [n for n, _ in learnable_layers(model, torch.empty(1, 3, 224, 224))]
    # aux1 runs right after inception4a, aux2 after inception4d (registration order puts both at the end).
    assert names.index("aux1.conv.conv") == names.index("inception4a.branch4.1.bn") + 1
    assert names.index("aux2.conv.conv") == names.index("inception4d.branch4.1.bn") + 1
    assert names[-1] == "fc"


def test_learnable_layers_follow_forward_not_registration_order():
    class Swapped(nn.Module):
        def __init__(self):
            super().__init__()
            self.late = nn.Linear(3, 2)
            self.early = nn.Linear(4, 3)

        def forward(self, x):
            return self.late(torch.relu(self.early(x)))

    model = Swapped()
    assert [n for n, _ in learnable_layers(model)] == ["late", "early"]
    assert [n for n, _ in learnable_layers(model, torch.zeros(2, 4))] == ["early", "late"]


def test_unknown_model_is_one_line_listing_choices():
    with pytest.raises(UserError) as exc:
        get_model("resnet51")
    msg = str(exc.value)
    assert "\n" not in msg and "resnet51" in msg and all(n in msg for n in PUBLISHED)
    with pytest.raises(UserError):
        example_input("lenet5", 0)


def test_classification_loss_adds_each_aux_head_with_weight_0_3():
    from dpcomm.models.loss import AUX_WEIGHT, classification_loss

    torch.manual_seed(0)
    y = torch.randint(0, 5, (4,))
    main, aux2, aux1 = (torch.randn(4, 5) for _ in range(3))
    ce = nn.functional.cross_entropy
    assert classification_loss(main, y) == ce(main, y)  # eval mode: logits alone
    want = ce(main, y) + AUX_WEIGHT * ce(aux2, y) + AUX_WEIGHT * ce(aux1, y)
    assert torch.equal(classification_loss((main, aux2, aux1), y), want) and AUX_WEIGHT == 0.3
    assert torch.equal(classification_loss((main, None), y), ce(main, y))  # inception-v3 without aux


def test_classification_loss_flattens_per_token_logits():
    from dpcomm.models.loss import classification_loss

    torch.manual_seed(0)
    logits, y = torch.randn(2, 5, 7), torch.randint(0, 7, (2, 5))
    want = nn.functional.cross_entropy(logits.reshape(10, 7), y.reshape(10))
    assert torch.equal(classification_loss(logits, y), want)
    assert torch.allclose(want, nn.functional.cross_entropy(logits.transpose(1, 2), y))  # mean over tokens


def test_googlenet_trains_on_its_tuple_output():
    from dpcomm.models.loss import classification_loss

    model = GoogLeNet(num_classes=10)  # aux heads on: training mode returns (logits, aux2, aux1)
    x, y = torch.randn(2, 3, 32, 32), torch.tensor([1, 2])
    out = model(x)
    assert isinstance(out, tuple) and len(out) == 3
    classification_loss(out, y).backward()
    assert model.aux1.fc2.weight.grad is not None and model.fc.weight.grad is not None
