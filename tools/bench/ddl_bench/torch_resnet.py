"""ResNet-50 built in code (He et al. 2015, bottleneck v1.5), for benchmarks where torchvision is absent.

torchvision's ``resnet50`` is used when it imports; this one has the same layers and
parameter count (25,557,032), so a benchmark measures the same gradient stream either way.
"""

from __future__ import annotations

from torch import Tensor, nn


class Bottleneck(nn.Module):
    """1x1 -> 3x3 (stride here, as in v1.5) -> 1x1 (x4 channels), plus a projection shortcut where shapes change."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        out = planes * 4
        self.conv1, self.bn1 = nn.Conv2d(inplanes, planes, 1, bias=False), nn.BatchNorm2d(planes)
        self.conv2, self.bn2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False), nn.BatchNorm2d(planes)
        self.conv3, self.bn3 = nn.Conv2d(planes, out, 1, bias=False), nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = (nn.Sequential(nn.Conv2d(inplanes, out, 1, stride, bias=False), nn.BatchNorm2d(out))
                           if stride != 1 or inplanes != out else None)

    def forward(self, x: Tensor) -> Tensor:
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        out: Tensor = self.relu(y + (x if self.downsample is None else self.downsample(x)))
        return out


def resnet50(num_classes: int = 1000) -> nn.Module:
    """ResNet-50: torchvision's where it imports, else the same network built here."""
    try:
        from torchvision.models import resnet50 as tv_resnet50  # type: ignore[import-not-found,unused-ignore]
    except Exception:  # torchvision absent, or built against another torch
        pass
    else:
        model: nn.Module = tv_resnet50(num_classes=num_classes)
        return model
    layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                               nn.MaxPool2d(3, 2, 1)]
    inplanes = 64
    for planes, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for b in range(blocks):
            layers.append(Bottleneck(inplanes, planes, stride if b == 0 else 1))
            inplanes = planes * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, num_classes)]
    return nn.Sequential(*layers)
