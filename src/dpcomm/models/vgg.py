"""VGG-19 (Simonyan and Zisserman, 2015, configuration E) as torchvision's ``vgg19``: 143,667,240 parameters.

16 convolutions 3x3 and 3 fully connected layers (19 learnable layers). The BML paper (section 5) trains it on
ImageNet ("about 143.65 million" parameters). ``num_classes=21841`` gives VGG19-22K (the full ImageNet-22K
label set) with 229,052,817 parameters: the last layer grows from 4096x1000 to 4096x21841.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["VGG", "VGG19_CFG"]

VGG19_CFG: tuple[int | str, ...] = (
    64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M",
)  # fmt: skip
"""Configuration E: output channels of each 3x3 convolution, ``"M"`` a 2x2 max-pool."""


class VGG(nn.Module):
    """A VGG network without batch normalisation (torchvision's layout and initialisation)."""

    def __init__(self, cfg: tuple[int | str, ...] = VGG19_CFG, num_classes: int = 1000, dropout: float = 0.5):
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for v in cfg:
            if v == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                layers += [nn.Conv2d(channels, int(v), kernel_size=3, padding=1), nn.ReLU(inplace=True)]
                channels = int(v)
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(p=dropout),
            nn.Linear(4096, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(p=dropout),
            nn.Linear(4096, num_classes),
        )
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))
