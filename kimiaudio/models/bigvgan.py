"""The BigVGAN vocoder (`vocoder/config.json` + `vocoder/model.pt["generator"]`): mel -> 24 kHz.

Follows NVIDIA BigVGAN v2 as vendored by Kimi-Audio (kimia_infer/models/detokenizer/vocoder/):
weight-normed convs (weight_g/weight_v, dim=0; the official forward recomputes g * v / |v| each
call from the same tensors, `fold_weight_norm` computes it once after loading: the same values),
AMP blocks of anti-aliased Snake/SnakeBeta activations (2x upsample with the stored kaiser-sinc
filter, activation, 2x lowpass downsample, replicate padding at the edges), the mean over the
resblocks of each stage, then tanh or clamp. This is the plain PyTorch activation path, not the
fused CUDA kernel. Every sample of a batch is independent, so equal-length mels batch exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kimiaudio.checkpoint.files import config_value, load_into, load_torch_file, read_json
from kimiaudio.errors import CheckpointError

FILTER_TAPS = 12  # Activation1d's fixed up/down kernel size (ratio 2) in the official code
RATIO = 2


@dataclass(frozen=True)
class VocoderConfig:
    num_mels: int
    upsample_rates: tuple[int, ...]
    upsample_kernel_sizes: tuple[int, ...]
    upsample_initial_channel: int
    resblock: str
    resblock_kernel_sizes: tuple[int, ...]
    resblock_dilation_sizes: tuple[tuple[int, ...], ...]
    activation: str
    snake_logscale: bool
    use_tanh_at_final: bool
    use_bias_at_final: bool
    sampling_rate: int

    @property
    def hop_size(self) -> int:
        """Output samples per mel frame (product of the upsample rates)."""
        hop = 1
        for rate in self.upsample_rates:
            hop *= rate
        return hop

    @classmethod
    def from_json(cls, path: Path) -> VocoderConfig:
        raw = read_json(path)

        def ints(key):
            value = config_value(raw, key, path)
            if not isinstance(value, list) or not value or not all(type(v) is int and v > 0 for v in value):
                raise CheckpointError(f"{path}: {key!r} = {value!r}, expected a list of positive ints")
            return tuple(value)

        def one(key, kind, default=...):
            value = config_value(raw, key, path, default)
            if type(value) is not kind or (kind is int and value <= 0):
                raise CheckpointError(f"{path}: {key!r} = {value!r}, expected {kind.__name__}")
            return value

        dilations = config_value(raw, "resblock_dilation_sizes", path)
        if not isinstance(dilations, list) or not all(
            isinstance(d, list) and d and all(type(x) is int and x > 0 for x in d) for d in dilations
        ):
            raise CheckpointError(f"{path}: 'resblock_dilation_sizes' must be a list of lists of positive ints")
        cfg = cls(
            num_mels=one("num_mels", int),
            upsample_rates=ints("upsample_rates"),
            upsample_kernel_sizes=ints("upsample_kernel_sizes"),
            upsample_initial_channel=one("upsample_initial_channel", int),
            resblock=one("resblock", str),
            resblock_kernel_sizes=ints("resblock_kernel_sizes"),
            resblock_dilation_sizes=tuple(tuple(d) for d in dilations),
            activation=one("activation", str),
            snake_logscale=one("snake_logscale", bool, True),
            use_tanh_at_final=one("use_tanh_at_final", bool, True),  # official defaults
            use_bias_at_final=one("use_bias_at_final", bool, True),
            sampling_rate=one("sampling_rate", int),
        )
        if cfg.resblock not in ("1", "2"):
            raise CheckpointError(f"{path}: 'resblock' = {cfg.resblock!r}, expected '1' or '2'")
        if cfg.activation not in ("snake", "snakebeta"):
            raise CheckpointError(f"{path}: 'activation' = {cfg.activation!r}, expected 'snake' or 'snakebeta'")
        if len(cfg.upsample_kernel_sizes) != len(cfg.upsample_rates):
            raise CheckpointError(f"{path}: upsample_rates and upsample_kernel_sizes differ in length")
        if len(cfg.resblock_dilation_sizes) != len(cfg.resblock_kernel_sizes):
            raise CheckpointError(f"{path}: resblock_kernel_sizes and resblock_dilation_sizes differ in length")
        if cfg.upsample_initial_channel % 2 ** len(cfg.upsample_rates):
            raise CheckpointError(f"{path}: upsample_initial_channel must halve {len(cfg.upsample_rates)} times")
        return cfg


class WNConv1d(nn.Module):
    """Conv1d (or ConvTranspose1d) whose weight is weight_g * weight_v / |weight_v| over dims 1...
    Until `fold` it is recomputed each call, as torch's weight_norm does; after, it is stored."""

    def __init__(self, cin, cout, kernel, stride=1, padding=0, dilation=1, bias=True, transposed=False):
        super().__init__()
        shape = (cin, cout, kernel) if transposed else (cout, cin, kernel)
        self.weight_g = nn.Parameter(torch.ones(shape[0], 1, 1))
        self.weight_v = nn.Parameter(torch.zeros(shape))
        self.bias = nn.Parameter(torch.zeros(cout)) if bias else None
        self.stride, self.padding, self.dilation, self.transposed = stride, padding, dilation, transposed
        self.weight: Tensor | None = None

    @torch.no_grad()
    def fold(self) -> None:
        """Store g * v / |v| (computed by the same function, on the same device and dtype, as
        each official forward computes it) and drop g and v."""
        weight = torch._weight_norm(self.weight_v, self.weight_g, 0)
        del self.weight_g, self.weight_v
        self.weight = nn.Parameter(weight, requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        weight = self.weight if self.weight is not None else torch._weight_norm(self.weight_v, self.weight_g, 0)
        if self.transposed:
            return F.conv_transpose1d(x, weight, self.bias, self.stride, self.padding)
        return F.conv1d(x, weight, self.bias, self.stride, self.padding, self.dilation)


class Snake(nn.Module):
    """x + sin²(αx)/(β+1e-9), α=β for plain Snake; α, β stored as logs when logscale."""

    def __init__(self, channels: int, logscale: bool, beta: bool):
        super().__init__()
        self.logscale = logscale
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels)) if beta else None

    def forward(self, x: Tensor) -> Tensor:
        alpha = self.alpha[None, :, None]  # [1, C, 1]
        beta = alpha if self.beta is None else self.beta[None, :, None]
        if self.logscale:
            alpha, beta = torch.exp(alpha), torch.exp(beta)
        periodic = torch.sin(x * alpha).square_()  # in place: one full-rate buffer fewer
        return x + (1.0 / (beta + 1e-9)) * periodic


class UpSample1d(nn.Module):
    filter: Tensor  # a buffer: the checkpoint's kaiser-sinc taps

    def __init__(self):
        super().__init__()
        self.register_buffer("filter", torch.zeros(1, 1, FILTER_TAPS))
        self.pad = FILTER_TAPS // RATIO - 1
        self.crop_left = self.pad * RATIO + (FILTER_TAPS - RATIO) // 2
        self.crop_right = self.pad * RATIO + (FILTER_TAPS - RATIO + 1) // 2

    def forward(self, x: Tensor) -> Tensor:
        channels = x.shape[1]
        x = F.pad(x, (self.pad, self.pad), mode="replicate")
        x = RATIO * F.conv_transpose1d(x, self.filter.expand(channels, -1, -1), stride=RATIO, groups=channels)
        return x[..., self.crop_left : -self.crop_right]


class LowPassFilter1d(nn.Module):
    filter: Tensor  # a buffer: the checkpoint's kaiser-sinc taps

    def __init__(self):
        super().__init__()
        self.register_buffer("filter", torch.zeros(1, 1, FILTER_TAPS))
        self.pad_left = FILTER_TAPS // 2 - int(FILTER_TAPS % 2 == 0)
        self.pad_right = FILTER_TAPS // 2

    def forward(self, x: Tensor) -> Tensor:
        channels = x.shape[1]
        x = F.pad(x, (self.pad_left, self.pad_right), mode="replicate")
        return F.conv1d(x, self.filter.expand(channels, -1, -1), stride=RATIO, groups=channels)


class DownSample1d(nn.Module):
    def __init__(self):
        super().__init__()
        self.lowpass = LowPassFilter1d()

    def forward(self, x: Tensor) -> Tensor:
        return self.lowpass(x)


class Activation1d(nn.Module):
    """Anti-aliased activation: 2x upsample, Snake(Beta), 2x downsample."""

    def __init__(self, channels: int, cfg: VocoderConfig):
        super().__init__()
        self.upsample = UpSample1d()
        self.act = Snake(channels, cfg.snake_logscale, beta=cfg.activation == "snakebeta")
        self.downsample = DownSample1d()

    def forward(self, x: Tensor) -> Tensor:
        return self.downsample(self.act(self.upsample(x)))


def _same_padding(kernel: int, dilation: int) -> int:
    return (kernel * dilation - dilation) // 2


class AMPBlock1(nn.Module):
    """x += c2(a2(c1(a1(x)))) per dilation; c1 dilated, c2 at dilation 1."""

    def __init__(self, channels: int, kernel: int, dilations: tuple[int, ...], cfg: VocoderConfig):
        super().__init__()
        self.convs1 = nn.ModuleList(
            WNConv1d(channels, channels, kernel, padding=_same_padding(kernel, d), dilation=d) for d in dilations
        )
        self.convs2 = nn.ModuleList(
            WNConv1d(channels, channels, kernel, padding=_same_padding(kernel, 1)) for _ in dilations
        )
        self.activations = nn.ModuleList(Activation1d(channels, cfg) for _ in range(2 * len(dilations)))

    def forward(self, x: Tensor) -> Tensor:
        acts1, acts2 = self.activations[::2], self.activations[1::2]
        for c1, c2, a1, a2 in zip(self.convs1, self.convs2, acts1, acts2):
            x = c2(a2(c1(a1(x)))) + x
        return x


class AMPBlock2(nn.Module):
    """x += c(a(x)) per dilation (the official forward forgets to return x; this one does)."""

    def __init__(self, channels: int, kernel: int, dilations: tuple[int, ...], cfg: VocoderConfig):
        super().__init__()
        self.convs = nn.ModuleList(
            WNConv1d(channels, channels, kernel, padding=_same_padding(kernel, d), dilation=d) for d in dilations
        )
        self.activations = nn.ModuleList(Activation1d(channels, cfg) for _ in dilations)

    def forward(self, x: Tensor) -> Tensor:
        for conv, act in zip(self.convs, self.activations):
            x = conv(act(x)) + x
        return x


class BigVGAN(nn.Module):
    def __init__(self, cfg: VocoderConfig):
        super().__init__()
        self.cfg = cfg
        ch = cfg.upsample_initial_channel
        self.conv_pre = WNConv1d(cfg.num_mels, ch, 7, padding=3)
        self.ups = nn.ModuleList()
        self.resblocks = nn.ModuleList()
        block = AMPBlock1 if cfg.resblock == "1" else AMPBlock2
        for i, (rate, kernel) in enumerate(zip(cfg.upsample_rates, cfg.upsample_kernel_sizes)):
            cin, cout = ch // 2**i, ch // 2 ** (i + 1)
            up = WNConv1d(cin, cout, kernel, stride=rate, padding=(kernel - rate) // 2, transposed=True)
            self.ups.append(nn.ModuleList([up]))
            for k, d in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes):
                self.resblocks.append(block(cout, k, d, cfg))
        self.activation_post = Activation1d(cout, cfg)
        self.conv_post = WNConv1d(cout, 1, 7, padding=3, bias=cfg.use_bias_at_final)

    def fold_weight_norm(self) -> BigVGAN:
        """Compute every conv weight once (after the final .to(device, dtype)); see WNConv1d.fold."""
        for module in self.modules():
            if isinstance(module, WNConv1d):
                module.fold()
        return self

    def forward(self, mel: Tensor) -> Tensor:
        """mel [B, num_mels, T] -> wav [B, 1, T * hop_size] in [-1, 1]."""
        x = self.conv_pre(mel)
        kernels = len(self.cfg.resblock_kernel_sizes)
        for i, up in enumerate(self.ups):
            x = cast(nn.ModuleList, up)[0](x)  # ups.i.0: the checkpoint's names
            stage = self.resblocks[i * kernels : (i + 1) * kernels]
            xs = stage[0](x)
            for block in stage[1:]:
                xs += block(x)
            x = xs / kernels
        x = self.conv_post(self.activation_post(x))
        return torch.tanh(x) if self.cfg.use_tanh_at_final else torch.clamp(x, min=-1.0, max=1.0)


def load_vocoder(directory: Path, device: torch.device, dtype: torch.dtype, fold: bool = True) -> BigVGAN:
    """vocoder/config.json + vocoder/model.pt["generator"]; weight norm folded unless `fold` is off."""
    directory = Path(directory)
    cfg = VocoderConfig.from_json(directory / "config.json")
    weights = directory / "model.pt"
    model = BigVGAN(cfg)
    load_into(model, load_torch_file(weights, "generator"), weights)
    model = model.to(device=device, dtype=dtype).eval()
    return model.fold_weight_norm() if fold else model
