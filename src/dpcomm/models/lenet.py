"""LeNet-5 as the BML paper trains it on MNIST: the 3.27 M-parameter variant.

BML (Song et al., section 5, "LeNet-5 has a 5-layer model, with a total number of 3.27 million parameters";
seeds/004) uses the TensorFlow MNIST tutorial network: conv 5x5x32 -> pool -> conv 5x5x64 -> pool ->
fc 3136->1024 -> fc 1024->10 on 28x28x1 inputs. Parameters: 832 + 51,264 + 3,212,288 + 10,250 = 3,274,634.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["LeNet5"]


class LeNet5(nn.Module):
    """Two 5x5 'same' convolutions with 2x2 max-pooling, then two fully connected layers (4 learnable)."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, kernel_size=5, padding=2)  # 28x28x32, pooled to 14x14
        self.conv2 = nn.Conv2d(32, 64, kernel_size=5, padding=2)  # 14x14x64, pooled to 7x7
        self.fc1 = nn.Linear(7 * 7 * 64, 1024)  # 3136 -> 1024
        self.fc2 = nn.Linear(1024, num_classes)
        self.pool = nn.MaxPool2d(2)
        self.dropout = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        x = self.dropout(torch.relu(self.fc1(torch.flatten(x, 1))))
        return self.fc2(x)
