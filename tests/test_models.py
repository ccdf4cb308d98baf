"""The model zoo: parameter counts pinned to the published figures, learnable-layer counts, forward shapes.

The big models are built on the ``meta`` device (shapes only: no memory, no compute); only LeNet-5 and
ResNet-20 run a real forward. Budget: ~5 s.
"""

import pytest
import torch
from torch import nn

from dpcomm.errors import UserError
from dpcomm.models import (
    count_params,
    example_input,
    get_model,
    input_shape,
    learnable_layers,
    model_names,
    num_classes,
)
from dpcomm.models.googlenet import GoogLeNet
from dpcomm.models.inception import InceptionV3

# name: (published parameter count, learnable layers). Sources: torchvision's model table (alexnet, vgg19,
# resnet50, inception_v3 with its aux head), BML (LeNet-5 3.27 M: 832 + 51,264 + 3,212,288 + 10,250),
# He et al. Table 6 (ResNet-20 0.27 M), VGG-19 with a 4096x21841 last layer (~229 M).
PUBLISHED = {
    "lenet5": (3_274_634, 4),
    "alexnet": (61_100_840, 8),
    "vgg19": (143_667_240, 19),
    "vgg19-22k": (229_052_817, 19),
    "googlenet": (13_004_888, 57 * 2 + 1 + 2 * 4),
    "inception-v3": (27_161_264, 94 * 2 + 1 + 5),
    "resnet50": (25_557_032, 53 * 2 + 1),
    "resnet20": (269_722, 19 * 2 + 1),
}


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


def test_without_auxiliary_heads_matches_torchvision_inference_counts():
    with torch.device("meta"):
        g, i = GoogLeNet(aux_logits=False), InceptionV3(aux_logits=False)
    assert sum(p.numel() for p in g.parameters()) == 6_624_904
    assert sum(p.numel() for p in i.parameters()) == 23_834_568


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_output_shapes_on_meta(name):
    with torch.device("meta"):
        model = get_model(name)
        out = model(torch.empty(2, *input_shape(name)))
        model.eval()
        logits = model(torch.empty(2, *input_shape(name)))
    heads = out if isinstance(out, tuple) else (out,)
    assert len(heads) == {"googlenet": 3, "inception-v3": 2}.get(name, 1)
    assert all(h.shape == (2, num_classes(name)) for h in (*heads, logits))


@pytest.mark.parametrize("name, shape", [("lenet5", (1, 28, 28)), ("resnet20", (3, 32, 32))])
def test_small_models_really_run(name, shape):
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two threads on this shared 2-core machine wait on each other
    try:
        _run_small(name, shape)
    finally:
        torch.set_num_threads(threads)


def _run_small(name, shape):
    assert input_shape(name) == shape
    x = example_input(name, 4)
    assert x.shape == (4, *shape)
    model = get_model(name)
    y = model(x)
    assert y.shape == (4, 10) and torch.isfinite(y).all()
    y.sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    assert get_model(name, num_classes=3)(x).shape == (4, 3)


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


def test_googlenet_trains_on_its_tuple_output():
    from dpcomm.models.loss import classification_loss

    model = GoogLeNet(num_classes=10)  # aux heads on: training mode returns (logits, aux2, aux1)
    x, y = torch.randn(2, 3, 64, 64), torch.tensor([1, 2])
    out = model(x)
    assert isinstance(out, tuple) and len(out) == 3
    classification_loss(out, y).backward()
    assert model.aux1.fc2.weight.grad is not None and model.fc.weight.grad is not None
