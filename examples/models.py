"""Small GPT-2-style and ResNet-style models for tests and benchmarks.

They use the ops real models use: scaled_dot_product_attention (causal), split, GELU (tanh),
tied embeddings, cross_entropy with ignore_index and label_smoothing; conv2d with stride,
padding, dilation and groups, batch norm, max/avg/adaptive-avg pooling, in-place relu and add.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class GPT2Block(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads, self.dropout = heads, dropout
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        x = x + self.drop(self.proj(a.transpose(1, 2).contiguous().view(b, t, d)))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh")))


class GPT2(nn.Module):
    def __init__(self, vocab: int = 48, block: int = 32, d: int = 64, heads: int = 4, layers: int = 2,
                 dropout: float = 0.0):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.blocks = nn.ModuleList(GPT2Block(d, heads, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.tie_weights()

    def tie_weights(self):
        # module.to(xla) creates new Parameter objects per module (as in PyTorch/XLA), which unties
        # shared weights: call again after moving the model, as Hugging Face's tie_weights() does.
        self.head.weight = self.tok.weight

    def forward(self, idx, targets=None, ignore_index: int = -100, label_smoothing: float = 0.0):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), ignore_index=ignore_index,
                               label_smoothing=label_smoothing)
        return logits, loss


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, groups: int = 1, dilation: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=dilation, dilation=dilation, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, groups=groups, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = self.bn2(self.conv2(out))
        out += x if self.short is None else self.short(x)
        return out.relu_()


class ResNet(nn.Module):
    def __init__(self, classes: int = 10, width: int = 16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2, padding=1))
        self.layer1 = BasicBlock(width, width, 1, groups=2)
        self.layer2 = BasicBlock(width, 2 * width, 2, dilation=2)
        self.pool = nn.AvgPool2d(2, ceil_mode=True)
        self.head = nn.Linear(2 * width, classes)

    def forward(self, x):
        x = self.pool(self.layer2(self.layer1(self.stem(x))))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.head(x)
