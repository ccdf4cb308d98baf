"""GoogLeNet (Szegedy et al., 2015, "Going deeper with convolutions") in torchvision's form.

Built as torchvision's ``googlenet`` (batch norm after every convolution, a 3x3 convolution in the branch
the paper gives as 5x5, kept by torchvision for weight compatibility) **with its two auxiliary classifiers**,
because they are trained and their gradients communicated: MG-WFBP (section V) trains Caffe's GoogLeNet, aux
heads included, at batch size 64 and quotes "about 13 millions of parameters".

Parameters: 13,004,888 with the auxiliary classifiers (the zoo's ``googlenet``); 6,624,904 without them,
torchvision's published figure for its inference model (``aux_logits=False``). Learnable layers: 57
convolutions + 57 batch norms + 1 fc = 115, plus 4 per auxiliary head (conv, bn, fc1, fc2) = 123.
In training mode with aux heads the forward returns ``(logits, aux2, aux1)``; in eval mode the logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GoogLeNet", "BasicConv2d"]


class BasicConv2d(nn.Module):
    """Convolution without bias, batch norm (eps 1e-3), ReLU: 2 learnable layers."""

    def __init__(self, in_channels: int, out_channels: int, **kwargs) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, bias=False, **kwargs)
        self.bn = nn.BatchNorm2d(out_channels, eps=0.001)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)), inplace=True)


class _Inception(nn.Module):
    """Four parallel branches (1x1; 1x1->3x3; 1x1->3x3; 3x3 max-pool->1x1), concatenated on channels."""

    def __init__(self, cin: int, c1: int, c3r: int, c3: int, c5r: int, c5: int, pool_proj: int) -> None:
        super().__init__()
        self.branch1 = BasicConv2d(cin, c1, kernel_size=1)
        self.branch2 = nn.Sequential(
            BasicConv2d(cin, c3r, kernel_size=1), BasicConv2d(c3r, c3, kernel_size=3, padding=1)
        )
        self.branch3 = nn.Sequential(  # 3x3 where the paper has 5x5: torchvision's layout, kept for its count
            BasicConv2d(cin, c5r, kernel_size=1), BasicConv2d(c5r, c5, kernel_size=3, padding=1)
        )
        self.branch4 = nn.Sequential(
            nn.MaxPool2d(kernel_size=3, stride=1, padding=1, ceil_mode=True),
            BasicConv2d(cin, pool_proj, kernel_size=1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch1(x), self.branch2(x), self.branch3(x), self.branch4(x)], 1)


class _InceptionAux(nn.Module):
    """Auxiliary classifier: 4x4 average pool, 1x1 conv 128, fc 2048->1024, fc 1024->classes."""

    def __init__(self, cin: int, num_classes: int, dropout: float = 0.7) -> None:
        super().__init__()
        self.conv = BasicConv2d(cin, 128, kernel_size=1)
        self.fc1 = nn.Linear(2048, 1024)
        self.fc2 = nn.Linear(1024, num_classes)
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(F.adaptive_avg_pool2d(x, (4, 4)))
        x = self.dropout(F.relu(self.fc1(torch.flatten(x, 1)), inplace=True))
        return self.fc2(x)


class GoogLeNet(nn.Module):
    """Inception-v1 on 224x224x3 inputs (torchvision's layout and initialisation)."""

    def __init__(self, num_classes: int = 1000, aux_logits: bool = True, dropout: float = 0.2) -> None:
        super().__init__()
        pool = {"kernel_size": 3, "stride": 2, "ceil_mode": True}
        self.conv1 = BasicConv2d(3, 64, kernel_size=7, stride=2, padding=3)
        self.maxpool1 = nn.MaxPool2d(**pool)
        self.conv2 = BasicConv2d(64, 64, kernel_size=1)
        self.conv3 = BasicConv2d(64, 192, kernel_size=3, padding=1)
        self.maxpool2 = nn.MaxPool2d(**pool)
        self.inception3a = _Inception(192, 64, 96, 128, 16, 32, 32)
        self.inception3b = _Inception(256, 128, 128, 192, 32, 96, 64)
        self.maxpool3 = nn.MaxPool2d(**pool)
        self.inception4a = _Inception(480, 192, 96, 208, 16, 48, 64)
        self.inception4b = _Inception(512, 160, 112, 224, 24, 64, 64)
        self.inception4c = _Inception(512, 128, 128, 256, 24, 64, 64)
        self.inception4d = _Inception(512, 112, 144, 288, 32, 64, 64)
        self.inception4e = _Inception(528, 256, 160, 320, 32, 128, 128)
        self.maxpool4 = nn.MaxPool2d(kernel_size=2, stride=2, ceil_mode=True)
        self.inception5a = _Inception(832, 256, 160, 320, 32, 128, 128)
        self.inception5b = _Inception(832, 384, 192, 384, 48, 128, 128)
        self.aux1 = _InceptionAux(512, num_classes) if aux_logits else None
        self.aux2 = _InceptionAux(528, num_classes) if aux_logits else None
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.dropout = nn.Dropout(p=dropout)
        self.fc = nn.Linear(1024, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d | nn.Linear):
                nn.init.trunc_normal_(m.weight, mean=0.0, std=0.01, a=-2, b=2)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.maxpool1(self.conv1(x))
        x = self.maxpool2(self.conv3(self.conv2(x)))
        x = self.maxpool3(self.inception3b(self.inception3a(x)))
        x = self.inception4a(x)
        aux1 = self.aux1(x) if self.aux1 is not None and self.training else None
        x = self.inception4d(self.inception4c(self.inception4b(x)))
        aux2 = self.aux2(x) if self.aux2 is not None and self.training else None
        x = self.maxpool4(self.inception4e(x))
        x = self.inception5b(self.inception5a(x))
        x = self.fc(self.dropout(torch.flatten(self.avgpool(x), 1)))
        if aux1 is not None and aux2 is not None:
            return x, aux2, aux1
        return x
