"""The networks the tracing tests describe: torchvision's and hand-written ones, each with an
example batch. Factories take no arguments (python3 -m joule spec networks:lenet5 works)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


def resnet18():
    import torchvision

    return torchvision.models.resnet18(num_classes=10)


def mobilenet_v2():
    import torchvision

    return torchvision.models.mobilenet_v2(num_classes=10)


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.Tanh(),
                         nn.Linear(128, 10))


class LeNet5(nn.Module):
    """Functional activations and pooling, and the view(x.size(0), -1) idiom."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(torch.relu(self.conv2(x)), kernel_size=2, stride=2)
        x = x.view(x.size(0), -1)
        x = F.relu(self.fc1(x))
        x = self.fc2(x).relu()
        return self.fc3(x)


def lenet5():
    return LeNet5()


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.block1 = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
                                    nn.MaxPool2d(2))
        self.block2 = nn.Sequential(nn.Conv2d(16, 32, 3, padding="same", bias=False), nn.BatchNorm2d(32),
                                    nn.ReLU(inplace=True), nn.AvgPool2d(2))
        self.dropout = nn.Dropout(0.25)
        self.head = nn.Linear(32 * 8 * 8, 10)
        self.softmax = nn.Softmax(dim=1)

    def forward(self, x):
        x = self.block2(self.block1(x))
        x = torch.flatten(self.dropout(x), 1)
        return self.softmax(F.dropout(self.head(x), p=0.1, training=self.training))


def small_cnn():
    return SmallCNN()


class TransformerClassifier(nn.Module):
    """Token ids → embedding → an encoder layer → nn.TransformerEncoder (expanded) → head."""

    def __init__(self, vocabulary=1000, width=64, sequence=16, classes=4):
        super().__init__()
        self.embedding = nn.Embedding(vocabulary, width)
        self.first = nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=128, batch_first=True)
        layer = nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=96, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, norm=nn.LayerNorm(width))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(sequence * width, classes))

    def forward(self, tokens):
        return self.head(self.encoder(self.first(self.embedding(tokens))))


def transformer_classifier():
    return TransformerClassifier()


class LSTMClassifier(nn.Module):
    """`out, _ = lstm(x)`, then the last step: Joule's lstm with output "last"."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(500, 32)
        self.lstm = nn.LSTM(32, 64, num_layers=2, batch_first=True)
        self.head = nn.Linear(64, 4)

    def forward(self, tokens):
        out, _ = self.lstm(self.embedding(tokens))
        return self.head(out[:, -1])


def lstm_classifier():
    return LSTMClassifier()


class GRUTagger(nn.Module):
    """A tag per step: the whole output sequence (Joule's gru with output "sequence")."""

    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(20, 48, batch_first=True)
        self.norm = nn.LayerNorm(48)
        self.hidden = nn.Linear(48, 32)
        self.tags = nn.Linear(32, 9)

    def forward(self, x):
        out, _ = self.gru(x)
        return self.tags(F.gelu(self.hidden(self.norm(out))))


def gru_tagger():
    return GRUTagger()


class GRUFinalState(nn.Module):
    """`_, h_n = gru(x)`, then h_n[-1]: the last layer's final state, Joule's output "last"."""

    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(12, 24, num_layers=3, batch_first=True)
        self.head = nn.Linear(24, 3)

    def forward(self, x):
        _, h_n = self.gru(x)
        return self.head(h_n[-1])


def gru_final_state():
    return GRUFinalState()


class Conv1dNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(4, 16, 5, padding=2), nn.BatchNorm1d(16), nn.ReLU(),
            nn.Conv1d(16, 32, 3, stride=2, padding=1), nn.SiLU(),
            nn.Conv1d(32, 32, 3, padding=2, dilation=2, groups=4), nn.Hardswish())
        self.head = nn.Linear(32 * 32, 6)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def conv1d_net():
    return Conv1dNet()


class Inception(nn.Module):
    """Four branches joined by torch.cat along the channels."""

    def __init__(self, channels=16):
        super().__init__()
        self.branch1 = nn.Conv2d(channels, 8, 1)
        self.branch3 = nn.Sequential(nn.Conv2d(channels, 8, 1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1))
        self.branch5 = nn.Sequential(nn.Conv2d(channels, 4, 1), nn.ReLU(), nn.Conv2d(4, 4, 5, padding=2))
        self.pool = nn.Sequential(nn.MaxPool2d(3, stride=1, padding=1), nn.Conv2d(channels, 4, 1))

    def forward(self, x):
        return F.relu(torch.cat([self.branch1(x), self.branch3(x), self.branch5(x), self.pool(x)], dim=1))


class InceptionNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.mixed = Inception(16)
        self.mixed2 = Inception(24)
        self.fc = nn.Linear(24, 10)

    def forward(self, x):
        x = self.mixed2(self.mixed(self.stem(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def inception_net():
    return InceptionNet()


class SqueezeExcitation(nn.Module):
    """Channel weights from a global mean, multiplied back in with broadcasting."""

    def __init__(self, channels, reduced):
        super().__init__()
        self.reduce = nn.Conv2d(channels, reduced, 1)
        self.expand = nn.Conv2d(reduced, channels, 1)

    def forward(self, x):
        scale = x.mean((2, 3), keepdim=True)
        scale = torch.sigmoid(self.expand(F.relu(self.reduce(scale))))
        return x * scale


class SENet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU())
        self.conv = nn.Conv2d(32, 32, 3, padding=1)
        self.se = SqueezeExcitation(32, 8)
        self.act = nn.Hardswish()
        self.pool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = self.stem(x)
        x = self.act(self.se(self.conv(x)) + x)
        return self.fc(self.pool(x).flatten(1))


def se_net():
    return SENet()


class Activations(nn.Module):
    """The activations beyond the ReLU family, as modules and as functions, with their arguments."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(24, 32)
        self.leaky = nn.LeakyReLU(0.2)
        self.fc2 = nn.Linear(32, 32)
        self.elu = nn.ELU(alpha=0.5)
        self.softplus = nn.Softplus(beta=2, threshold=10)
        self.mish = nn.Mish()
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        x = self.mish(self.softplus(self.elu(self.fc2(self.leaky(self.fc1(x))))))
        x = F.elu(F.leaky_relu(x, negative_slope=0.05), 2.0)
        return self.head(F.mish(F.softplus(x, beta=3)))


class BidirectionalTagger(nn.Module):
    """A two-layer bidirectional LSTM's whole sequence into a bidirectional GRU's last step (out[:, -1])."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(300, 16)
        self.tagger = nn.LSTM(16, 24, num_layers=2, batch_first=True, bidirectional=True)
        self.summary = nn.GRU(48, 12, batch_first=True, bidirectional=True)
        self.head = nn.Linear(24, 5)

    def forward(self, tokens):
        tagged, _ = self.tagger(self.embed(tokens))
        out, _ = self.summary(tagged)
        return self.head(out[:, -1])


class PreNormEncoder(nn.Module):
    """ViT-style: patches embedded by a linear, pre-norm GELU encoder layers, a final norm, the mean."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(48, 32)
        layer = nn.TransformerEncoderLayer(32, nhead=4, dim_feedforward=64, activation="gelu", norm_first=True,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, norm=nn.LayerNorm(32), enable_nested_tensor=False)
        self.head = nn.Linear(32, 10)

    def forward(self, patches):
        return self.head(self.encoder(self.embed(patches)).mean(dim=1))


class MeanOverTime(nn.Module):
    """A conv1d's output averaged over its time steps with torch.mean(x, 2)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 16, 3, padding=1)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(torch.mean(F.relu(self.conv(x)), 2))


class MeanOverTokens(nn.Module):
    """An encoder's output averaged over its tokens with Tensor.mean(dim=-2)."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(100, 24)
        self.encoder = nn.TransformerEncoderLayer(24, nhead=4, dim_feedforward=32, batch_first=True)
        self.head = nn.Linear(24, 3)

    def forward(self, tokens):
        return self.head(self.encoder(self.embedding(tokens)).mean(dim=-2))


def float_batch(*shape):
    return torch.randn(2, *shape)


def token_batch(length, vocabulary):
    return torch.randint(0, vocabulary, (2, length))


# name: (factory, example batch, needs graph specs: add/concat/mul or the new layer kinds)
NETWORKS = {
    "resnet18": (resnet18, lambda: float_batch(3, 32, 32)),
    "mobilenet_v2": (mobilenet_v2, lambda: float_batch(3, 32, 32)),
    "mlp": (mlp, lambda: float_batch(1, 28, 28)),
    "lenet5": (lenet5, lambda: float_batch(1, 28, 28)),
    "small_cnn": (small_cnn, lambda: float_batch(3, 32, 32)),
    "transformer_classifier": (transformer_classifier, lambda: token_batch(16, 1000)),
    "lstm_classifier": (lstm_classifier, lambda: token_batch(20, 500)),
    "gru_tagger": (gru_tagger, lambda: float_batch(12, 20)),
    "gru_final_state": (gru_final_state, lambda: float_batch(7, 12)),
    "conv1d_net": (conv1d_net, lambda: float_batch(4, 64)),
    "inception_net": (inception_net, lambda: float_batch(3, 16, 16)),
    "se_net": (se_net, lambda: float_batch(3, 16, 16)),
    "mean_over_time": (MeanOverTime, lambda: float_batch(4, 50)),
    "activations": (Activations, lambda: float_batch(24)),
    "bidirectional_tagger": (BidirectionalTagger, lambda: token_batch(10, 300)),
    "prenorm_encoder": (PreNormEncoder, lambda: float_batch(16, 48)),
    "mean_over_tokens": (MeanOverTokens, lambda: token_batch(12, 100)),
}
