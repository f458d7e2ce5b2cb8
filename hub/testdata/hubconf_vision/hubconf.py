# A hubconf.py shaped like a real vision repository's: Ember reads it without
# running it (hub/hubconf_py.h). hubconf_test and load_test list, help and
# load it.
dependencies = ["torch", 'torchvision']  # Python packages; Ember does not check them

import functools
import torch
from torch.hub import load_state_dict_from_url
from torchvision.models.resnet import ResNet, BasicBlock as _BasicBlock
from torchvision.models.segmentation import deeplabv3_resnet50 as deeplab  # listed as deeplab
from ._helpers import (
    _make_divisible,
    load_weights,
)

_MODEL_URLS = {
    "resnet18": "https://download.pytorch.org/models/resnet18-f37072fd.pth",
}

_NOTES = """
def not_an_entry_point():
    '''A def inside a string is not code.'''
"""


def _resnet(arch, block, layers, pretrained, progress, **kwargs):
    """Private helper: not an entry point."""
    model = ResNet(block, layers, **kwargs)
    if pretrained:
        model.load_state_dict(load_state_dict_from_url(_MODEL_URLS[arch], progress=progress))
    return model


def resnet18(pretrained=False, progress=True, **kwargs):
    """
    ResNet-18 model from
    `"Deep Residual Learning for Image Recognition" <https://arxiv.org/pdf/1512.03385.pdf>`_

    Args:
        pretrained (bool): If True, returns a model pre-trained on ImageNet
        progress (bool): If True, displays a progress bar of the download to stderr
    """
    return _resnet("resnet18", _BasicBlock, [2, 2, 2, 2], pretrained, progress, **kwargs)


def mobilenet_v2(pretrained: bool = False,
                 progress: bool = True,
                 **kwargs) -> torch.nn.Module:
    '''MobileNetV2: "Inverted Residuals and Linear Bottlenecks".

    Triple-single-quoted, with a \'quoted\' word and a tab\tescape.
        Indented more: kept relative.
    '''
    raise NotImplementedError("loaded through Python only")


@functools.lru_cache(maxsize=None)
def small_cnn(pretrained=False, **kwargs): "A decorated def with its docstring on the same line."; return None


def mlp(in_features=4, **kwargs):
    # A comment, then code: no docstring.
    return None


def entry_with_r_string():
    r"""Raw: \d+ stays as written."""


if torch.cuda.is_available():
    def cuda_only():
        """Nested in an if block: not top level."""


class Wrapper:
    def method(self):
        """A method: not listed."""
