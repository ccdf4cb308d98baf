"""Inception-V3 (Szegedy et al., 2016, "Rethinking the Inception architecture") in torchvision's form.

Built as torchvision's ``inception_v3`` with its auxiliary classifier (trained, so its gradients are
communicated): 27,161,264 parameters, torchvision's published figure; 23,834,568 without the auxiliary head.
Learnable layers: 94 convolutions + 94 batch norms + 1 fc = 189, plus 5 for the aux head (2 conv, 2 bn,
fc) = 194. Input 299x299x3. In training mode with the aux head the forward returns ``(logits, aux)``; in eval
mode the logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dpcomm.models.googlenet import BasicConv2d

__all__ = ["InceptionV3"]


def _avg3(x: torch.Tensor) -> torch.Tensor:
    return F.avg_pool2d(x, kernel_size=3, stride=1, padding=1)


class _InceptionA(nn.Module):
    """35x35 grid: 1x1 | 1x1->5x5 | 1x1->3x3->3x3 | avg-pool->1x1."""

    def __init__(self, cin: int, pool_features: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 64, kernel_size=1)
        self.branch5x5_1 = BasicConv2d(cin, 48, kernel_size=1)
        self.branch5x5_2 = BasicConv2d(48, 64, kernel_size=5, padding=2)
        self.branch3x3dbl_1 = BasicConv2d(cin, 64, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, kernel_size=3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, kernel_size=3, padding=1)
        self.branch_pool = BasicConv2d(cin, pool_features, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b1 = self.branch1x1(x)
        b5 = self.branch5x5_2(self.branch5x5_1(x))
        b3 = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        return torch.cat([b1, b5, b3, self.branch_pool(_avg3(x))], 1)


class _InceptionB(nn.Module):
    """Grid reduction 35 -> 17: 3x3/2 | 1x1->3x3->3x3/2 | max-pool/2."""

    def __init__(self, cin: int) -> None:
        super().__init__()
        self.branch3x3 = BasicConv2d(cin, 384, kernel_size=3, stride=2)
        self.branch3x3dbl_1 = BasicConv2d(cin, 64, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, kernel_size=3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, kernel_size=3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b3 = self.branch3x3(x)
        bd = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        return torch.cat([b3, bd, F.max_pool2d(x, kernel_size=3, stride=2)], 1)


class _InceptionC(nn.Module):
    """17x17 grid with factorised 7x7 convolutions (1x7 and 7x1)."""

    def __init__(self, cin: int, c7: int) -> None:
        super().__init__()
        row, col = {"kernel_size": (1, 7), "padding": (0, 3)}, {"kernel_size": (7, 1), "padding": (3, 0)}
        self.branch1x1 = BasicConv2d(cin, 192, kernel_size=1)
        self.branch7x7_1 = BasicConv2d(cin, c7, kernel_size=1)
        self.branch7x7_2 = BasicConv2d(c7, c7, **row)
        self.branch7x7_3 = BasicConv2d(c7, 192, **col)
        self.branch7x7dbl_1 = BasicConv2d(cin, c7, kernel_size=1)
        self.branch7x7dbl_2 = BasicConv2d(c7, c7, **col)
        self.branch7x7dbl_3 = BasicConv2d(c7, c7, **row)
        self.branch7x7dbl_4 = BasicConv2d(c7, c7, **col)
        self.branch7x7dbl_5 = BasicConv2d(c7, 192, **row)
        self.branch_pool = BasicConv2d(cin, 192, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b1 = self.branch1x1(x)
        b7 = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
        bd = self.branch7x7dbl_1(x)
        for conv in (self.branch7x7dbl_2, self.branch7x7dbl_3, self.branch7x7dbl_4, self.branch7x7dbl_5):
            bd = conv(bd)
        return torch.cat([b1, b7, bd, self.branch_pool(_avg3(x))], 1)


class _InceptionD(nn.Module):
    """Grid reduction 17 -> 8: 1x1->3x3/2 | 1x1->1x7->7x1->3x3/2 | max-pool/2."""

    def __init__(self, cin: int) -> None:
        super().__init__()
        self.branch3x3_1 = BasicConv2d(cin, 192, kernel_size=1)
        self.branch3x3_2 = BasicConv2d(192, 320, kernel_size=3, stride=2)
        self.branch7x7x3_1 = BasicConv2d(cin, 192, kernel_size=1)
        self.branch7x7x3_2 = BasicConv2d(192, 192, kernel_size=(1, 7), padding=(0, 3))
        self.branch7x7x3_3 = BasicConv2d(192, 192, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7x3_4 = BasicConv2d(192, 192, kernel_size=3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b3 = self.branch3x3_2(self.branch3x3_1(x))
        b7 = self.branch7x7x3_1(x)
        for conv in (self.branch7x7x3_2, self.branch7x7x3_3, self.branch7x7x3_4):
            b7 = conv(b7)
        return torch.cat([b3, b7, F.max_pool2d(x, kernel_size=3, stride=2)], 1)


class _InceptionE(nn.Module):
    """8x8 grid with expanded filter banks (1x3 and 3x1 side by side)."""

    def __init__(self, cin: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 320, kernel_size=1)
        self.branch3x3_1 = BasicConv2d(cin, 384, kernel_size=1)
        self.branch3x3_2a = BasicConv2d(384, 384, kernel_size=(1, 3), padding=(0, 1))
        self.branch3x3_2b = BasicConv2d(384, 384, kernel_size=(3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = BasicConv2d(cin, 448, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(448, 384, kernel_size=3, padding=1)
        self.branch3x3dbl_3a = BasicConv2d(384, 384, kernel_size=(1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = BasicConv2d(384, 384, kernel_size=(3, 1), padding=(1, 0))
        self.branch_pool = BasicConv2d(cin, 192, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b1 = self.branch1x1(x)
        b3 = self.branch3x3_1(x)
        b3 = torch.cat([self.branch3x3_2a(b3), self.branch3x3_2b(b3)], 1)
        bd = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        bd = torch.cat([self.branch3x3dbl_3a(bd), self.branch3x3dbl_3b(bd)], 1)
        return torch.cat([b1, b3, bd, self.branch_pool(_avg3(x))], 1)


class _InceptionAux(nn.Module):
    """Auxiliary classifier on the 17x17 grid: 5x5/3 average pool, 1x1 conv 128, 5x5 conv 768, fc."""

    def __init__(self, cin: int, num_classes: int) -> None:
        super().__init__()
        self.conv0 = BasicConv2d(cin, 128, kernel_size=1)
        self.conv1 = BasicConv2d(128, 768, kernel_size=5)
        self.fc = nn.Linear(768, num_classes)
        self.conv1.stddev = 0.01  # initialisation std, torchvision's
        self.fc.stddev = 0.001

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(self.conv0(F.avg_pool2d(x, kernel_size=5, stride=3)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, (1, 1)), 1))


class InceptionV3(nn.Module):
    """Inception-V3 on 299x299x3 inputs (torchvision's layout and initialisation)."""

    def __init__(self, num_classes: int = 1000, aux_logits: bool = True, dropout: float = 0.5) -> None:
        super().__init__()
        self.Conv2d_1a_3x3 = BasicConv2d(3, 32, kernel_size=3, stride=2)
        self.Conv2d_2a_3x3 = BasicConv2d(32, 32, kernel_size=3)
        self.Conv2d_2b_3x3 = BasicConv2d(32, 64, kernel_size=3, padding=1)
        self.maxpool1 = nn.MaxPool2d(kernel_size=3, stride=2)
        self.Conv2d_3b_1x1 = BasicConv2d(64, 80, kernel_size=1)
        self.Conv2d_4a_3x3 = BasicConv2d(80, 192, kernel_size=3)
        self.maxpool2 = nn.MaxPool2d(kernel_size=3, stride=2)
        self.Mixed_5b = _InceptionA(192, pool_features=32)
        self.Mixed_5c = _InceptionA(256, pool_features=64)
        self.Mixed_5d = _InceptionA(288, pool_features=64)
        self.Mixed_6a = _InceptionB(288)
        self.Mixed_6b = _InceptionC(768, c7=128)
        self.Mixed_6c = _InceptionC(768, c7=160)
        self.Mixed_6d = _InceptionC(768, c7=160)
        self.Mixed_6e = _InceptionC(768, c7=192)
        self.AuxLogits = _InceptionAux(768, num_classes) if aux_logits else None
        self.Mixed_7a = _InceptionD(768)
        self.Mixed_7b = _InceptionE(1280)
        self.Mixed_7c = _InceptionE(2048)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.dropout = nn.Dropout(p=dropout)
        self.fc = nn.Linear(2048, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d | nn.Linear):
                std = float(getattr(m, "stddev", 0.1))
                nn.init.trunc_normal_(m.weight, mean=0.0, std=std, a=-2, b=2)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        x = self.Conv2d_2b_3x3(self.Conv2d_2a_3x3(self.Conv2d_1a_3x3(x)))
        x = self.maxpool2(self.Conv2d_4a_3x3(self.Conv2d_3b_1x1(self.maxpool1(x))))
        for block in (self.Mixed_5b, self.Mixed_5c, self.Mixed_5d, self.Mixed_6a):
            x = block(x)
        for block in (self.Mixed_6b, self.Mixed_6c, self.Mixed_6d, self.Mixed_6e):
            x = block(x)
        aux = self.AuxLogits(x) if self.AuxLogits is not None and self.training else None
        x = self.Mixed_7c(self.Mixed_7b(self.Mixed_7a(x)))
        x = self.fc(self.dropout(torch.flatten(self.avgpool(x), 1)))
        return (x, aux) if aux is not None else x
